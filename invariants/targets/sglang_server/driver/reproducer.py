"""A finding's reproducer, written and validated on a real server: the trace's HTTP calls
round by round (repro_template.py filled in), SGLang's flags as a launch line, and a run of
both on CPU — a fresh server with the fake worker only (no gate, wall-clock time, SGLang's own
memory checks raising) — to see whether a client alone observes the failure.

Keeps: the script says only what a client can see (the server down, a 5xx); what only
kvspec's catalog saw is said as not reproducible over HTTP by the caller, never claimed here.
Run by the release's python: ``python reproducer.py`` with a JSON request on stdin
({"cfg", "sent", "finished_at", "title", "expected", "out", "tries"}); prints one JSON answer
({"rc", "output", "log_tail", "command"}). Imports nothing of kvspec.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import client
import launch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT_TIMEOUT = 900
SITE = re.compile(r'(?<=File ")[^"]*site-packages/')  # a traceback's paths, from the package


def rounds(sent: list, finished_at: dict) -> list[dict]:
    """The calls grouped by the iteration they were sent after; each round waits for the
    requests that had finished by then."""
    out: list[dict] = []
    waited: set[str] = set()
    for iteration, op in sent:
        if not out or out[-1]["iteration"] != iteration:
            after = sorted(
                r for r, at in finished_at.items() if at <= iteration and r not in waited
            )
            waited.update(after)
            out.append(dict(iteration=iteration, after=after, calls=[]))
        if op["op"] == "advance_clock":
            out[-1]["calls"].append(["sleep", {"seconds": op["seconds"]}])
        elif op.get("disconnect"):
            out[-1]["calls"].append(["hang_up", {"rid": op["rid"]}])
        else:
            path, body, _ = client.op_request(op)
            out[-1]["calls"].append([path, body])
    return [{k: v for k, v in r.items() if k != "iteration"} for r in out]


def script(request: dict) -> str:
    with open(os.path.join(HERE, "repro_template.py")) as template:
        text = template.read()
    found = json.dumps(rounds(request["sent"], request["finished_at"]), indent=1)
    return (
        text.replace("TITLE", request["title"])
        .replace("EXPECTED_TEXT", request["expected"].replace('"', "'"))
        .replace("ROUNDS_JSON", found)
    )


def launch_line(cfg: dict, cpu: bool) -> str:
    """The server's command line, SGLang's own environment knobs first (a GPU's: any model,
    ``$MODEL``; a CPU's: the fake worker's local config)."""
    env = " ".join(f"{k}={v}" for k, v in launch.sglang_environment(cfg).items())
    model = launch.MODEL_MARK
    line = shlex.join(launch.command(cfg, 30000, model, cpu))
    path = "$KVSPEC/" + os.path.relpath(launch.MODEL, launch.ROOT) if cpu else "$MODEL"
    return f"{env} python {line}".replace(launch.MODEL_MARK, f'"{path}"')


def write(request: dict) -> str:
    """repro.py and launch.sh in ``out``; the path of repro.py."""
    out, cfg = request["out"], request["cfg"]
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "repro.py")
    with open(path, "w") as handle:
        handle.write(script(request))
    with open(os.path.join(out, "launch.sh"), "w") as handle:
        handle.write(LAUNCH.format(real=launch_line(cfg, False), cpu=cpu_line(cfg)))
    return path


def cpu_line(cfg: dict) -> str:
    """The CPU line kvspec validated with, its paths under ``$KVSPEC`` (a kvspec checkout)."""
    here = lambda path: "$KVSPEC/" + os.path.relpath(path, launch.ROOT)  # noqa: E731
    paths = os.pathsep.join(here(p) for p in launch.PATH)
    hook = f"PYTHONPATH={here(launch.HOOK)} KVSPEC_SERVER_PATH={paths}"
    config = f"KVSPEC_SERVER_CONFIG={shlex.quote(json.dumps(cfg))}"
    tree = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python"
    return f"{hook} {config} {tree} {launch_line(cfg, True)}"


LAUNCH = """#!/usr/bin/env bash
# The server for repro.py: SGLang's own flags (port 30000), any small model on a GPU:
#   MODEL=Qwen/Qwen2.5-0.5B-Instruct bash launch.sh
# The model does not matter to the failure: only the requests' token ids and the flags do.
{real}

# kvspec validated it on CPU with its fake model worker instead (KVSPEC: a kvspec checkout):
# {cpu}
"""


def validate(request: dict, path: str) -> dict:
    """A fresh server (fake worker, no gate), the script against it, the server stopped."""
    folder = tempfile.mkdtemp(prefix="kvspec-repro-")
    server = launch.Server(
        request["cfg"], launch.free_port(), None, os.path.join(folder, "server.log")
    )
    try:
        server.wait_ready(float(os.environ.get("KVSPEC_SERVER_READY_TIMEOUT", "180")))
        argv = [sys.executable, path, "--port", str(server.port), "--tries", str(request["tries"])]
        ran = subprocess.run(argv, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT)
        return dict(
            rc=ran.returncode,
            output=(ran.stdout + ran.stderr).strip(),
            log_tail=crash_lines(server.log_path),
        )
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def crash_lines(log_path: str) -> list[str]:
    """The server log's lines about the failure (SGLang's exception and traceback)."""
    with open(log_path, errors="replace") as log:
        lines = [SITE.sub("", line) for line in log.read().splitlines()]
    start = next((i for i, line in enumerate(lines) if "Scheduler hit an exception" in line), None)
    return lines[start : start + 40] if start is not None else lines[-8:]


def main() -> None:
    request = json.loads(sys.stdin.read())
    path = write(request)
    try:
        answer = validate(request, path)
    except launch.LaunchError as exc:
        answer = dict(rc=2, output=str(exc), log_tail=[])
    print(json.dumps(dict(answer, command=launch_line(request["cfg"], False))))


if __name__ == "__main__":
    main()
