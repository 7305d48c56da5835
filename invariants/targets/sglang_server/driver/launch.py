"""One real SGLang server per trace: ``python -m sglang.launch_server`` under the release's
interpreter, on a loopback port, with the trace's configuration as SGLang's own flags and
kvspec's plugin (hook/) reached through PYTHONPATH — no file of SGLang or of the venv edited.

Keeps: the server is ours alone — started in its own process group, stopped by its own pid
and group (SIGTERM, then SIGKILL), whatever state it is in; a port in use, a server that dies
or does not come up in time is one line naming it, with the log's last lines, and no server
left running. The flags below are the whole configuration a maintainer needs to reproduce a
finding (``command`` is printed in reproducers as it ran).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = os.path.dirname(os.path.dirname(HERE))
ROOT = os.path.dirname(os.path.dirname(TARGETS))  # the kvspec checkout
SCHEDULER = os.path.join(TARGETS, "sglang_scheduler", "driver")
PATH = (
    HERE,
    SCHEDULER,
    os.path.join(TARGETS, "sglang", "driver"),
    os.path.join(TARGETS, "driverlib"),
)
HOOK = os.path.join(HERE, "hook")
MODEL = os.path.join(SCHEDULER, "model")
READY_LINE = "The server is fired up and ready to roll!"
# what every run sets: the trace's token ids, no warmup request in the state, loopback
FIXED = [
    "--skip-tokenizer-init",
    "--skip-server-warmup",
    "--host",
    "127.0.0.1",
    "--log-level",
    "info",
]
# what a CPU run adds: the fake worker's local config stands in for a model's weights
CPU = [
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--load-format",
    "dummy",
    "--disable-cuda-graph",
]
MODEL_MARK = "@MODEL@"


class LaunchError(RuntimeError):
    """The server could not be started (one line: why, with the log's last lines)."""


def flags(cfg: dict) -> list[str]:
    """SGLang's flags for one configuration (the sglang-scheduler driver's config op)."""
    out = [
        "--page-size", str(cfg["page_size"]),
        "--max-total-tokens", str(cfg["pool_tokens"]),
        "--max-running-requests", str(cfg["max_running_requests"]),
        "--context-length", str(cfg["max_context"]),
        "--max-prefill-tokens", str(cfg["max_prefill_tokens"]),
        "--chunked-prefill-size", str(cfg["chunked_prefill_size"] or -1),
        "--random-seed", str(cfg["seed"]),
    ]  # fmt: skip
    switches = {
        "--disable-overlap-schedule": not cfg["overlap"],
        "--enable-mixed-chunk": cfg["mixed_chunk"],
        "--disable-radix-cache": cfg["cache"] == "chunk",
        "--enable-streaming-session": cfg["streaming_sessions"],
    }
    return out + [flag for flag, on in switches.items() if on]


def command(cfg: dict, port: int, model: str = MODEL, cpu: bool = True) -> list[str]:
    """The launch line's arguments (``cpu`` False: a GPU server's, for a reproducer)."""
    where = CPU if cpu else []
    return [
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        *FIXED,
        *where,
        "--port",
        str(port),
        *flags(cfg),
    ]


PORTS = range(20_000, 50_000)  # SGLang also takes port + 10000 (gRPC, 0.5.11) and a few above


def free_port() -> int:
    """A loopback port no one holds, from ``PORTS``."""
    for port in random.Random().sample(PORTS, 50):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise LaunchError(f"no free port on 127.0.0.1 in {PORTS.start}-{PORTS.stop}")


def check_port(port: int) -> None:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise LaunchError(f"port {port} on 127.0.0.1 is in use") from None


def sglang_environment(cfg: dict) -> dict[str, str]:
    """SGLang's own knobs a configuration sets: its test retract, and a 1 s disconnect poll
    (SGLang's default 4 s: a client that went away is noticed sooner)."""
    env = {"SGLANG_REQUEST_STATE_WAIT_TIMEOUT": "1"}
    if cfg.get("retract_interval"):
        env.update(
            SGLANG_TEST_RETRACT="1", SGLANG_TEST_RETRACT_INTERVAL=str(cfg["retract_interval"])
        )
    return env


def environment(cfg: dict, control: str | None) -> dict[str, str]:
    """The server's environment: SGLang's knobs, and kvspec's hook — the plugin's path, the
    configuration, the control socket (None: the plugin installs the fake worker only)."""
    env = dict(os.environ)
    env.update(
        sglang_environment(cfg),
        PYTHONPATH=os.pathsep.join([HOOK, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        KVSPEC_SERVER_PATH=os.pathsep.join(PATH),
        KVSPEC_SERVER_CONFIG=json.dumps(cfg),
        SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="python",
    )
    if control is not None:
        env["KVSPEC_SERVER_CONTROL"] = control
    return env


class Server:
    """One launched server (its log in ``log_path``)."""

    def __init__(self, cfg: dict, port: int, control: str | None, log_path: str) -> None:
        check_port(port)
        self.port, self.log_path = port, log_path
        self.argv = [sys.executable, *command(cfg, port)]
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                self.argv, env=environment(cfg, control), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=HERE,
            )  # fmt: skip

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 4) -> str:
        with open(self.log_path, errors="replace") as log:
            tail = [line.strip() for line in log.read().splitlines() if line.strip()]
        return " | ".join(tail[-lines:])

    def wait_ready(self, timeout: float) -> None:
        """Until SGLang logs that it is ready; ``LaunchError`` when it dies or runs out of time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, errors="replace") as log:
                if READY_LINE in log.read():
                    return
            if not self.alive():
                raise LaunchError(
                    f"the server exited ({self.proc.returncode}) at start-up: {self.log_tail()}"
                )
            time.sleep(0.2)
        late = f"the server was not ready after {timeout:.0f} s (KVSPEC_SERVER_READY_TIMEOUT)"
        raise LaunchError(f"{late}: {self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM to the server's group, SIGKILL after 2 s (SGLang's shutdown would sleep
        5 s for crash diagnostics: nothing of a trace's server is worth keeping)."""
        for sig, wait in ((signal.SIGTERM, 2), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            break
        try:  # the group may outlive its leader (SGLang's children)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
