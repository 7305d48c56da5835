"""The sglang-scheduler target's subprocess: SGLang's REAL Scheduler and event loop (normal or
overlap), driven by JSON lines; only the model worker is fake (worker.py). Which adapter
drives the installed release is asked of its code (release_probes.py: imports, attributes,
signatures — never the version string), and every other shim is in that adapter
(``adapter_legacy``, ``adapter_components``, ``adapter_context``) or what they share.

Run by an sglang venv's python; imports nothing of kvspec. The process imports SGLang once,
then forks one child per trace (a ``config`` op): the child builds the real Scheduler and runs
its event loop until an ``end`` op, so a trace costs a Scheduler build, not an import of
SGLang, and no trace sees another's state. The loop calls ``recv_requests`` at the top of
every iteration: that is where the child answers the iteration just run and reads the next
ops — requests, session opens and closes and aborts are queued, a ``step`` hands them to
SGLang and lets one iteration run. Protocol, one line each way per op (the answer to a
``step`` comes when that iteration ends):

  in:  {"op": "config", "page_size", "pool_tokens", "max_reqs", "max_context",
        "max_running_requests", "chunked_prefill_size", "max_prefill_tokens", "overlap",
        "mixed_chunk", "cache", "streaming_sessions", "retract_interval", "seed",
        "eos_prob", "eos_id", "speculative"?, "swa"?: {"window", "tokens"}, "mla"?}
       {"op": "submit", "rid", "input_ids", "max_new_tokens", "ignore_eos", "session"?}
       {"op": "open_session", "session_id", "streaming", "timeout"}
       {"op": "close_session", "session_id"}
       {"op": "abort", "rid"} | {"op": "abort", "phase", "pick"}
       {"op": "flush_cache"}   {"op": "advance_clock", "seconds"}
       {"op": "step"}   {"op": "idle"}   {"op": "unfinished", "rids"}
       {"op": "stats"}   {"op": "end"}
  out: {"views": [...], "result": ..., "findings": [its own checkers' messages]} or
       {"error", "drift", "crash"?, "where"?, "trace", "ended": true} (driverlib/answers.py;
       the child has ended) or {"error": "..."} (an op refused; the trace goes on);
       the first line is a banner {"ready", "version", "adapter", "probes", "not_applicable",
       "supports"} (the adapter module that drives the release; each probe's answer and why;
       catalog ids that do not hold by this release's design, each with the reason; the
       engine features beyond the plain ones the adapter drives, e.g. "speculative"), or
       {"ready": false, "drift": true, "error", "adapter"} when a probe met an internal no
       adapter drives.
       ``idle`` answers whether SGLang is idle (its view the idle event's); ``stats`` answers
       {"counts"}.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# what every SGLang driver shares (the import stubs, the view records) lives in the sglang
# target's driver folder; what every driver shares, in driverlib
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "sglang", "driver"))
DRIVERLIB = os.path.normpath(os.path.join(HERE, "..", "..", "driverlib"))
OURS = (HERE, SHARED, DRIVERLIB)
sys.path[:0] = [HERE, SHARED, DRIVERLIB]
import stubs  # noqa: E402

INSTALLED = stubs.install()
logging.disable(logging.WARNING)

import answers  # noqa: E402
import hybrid  # noqa: E402
import release_probes  # noqa: E402
import seams  # noqa: E402
import sglang  # noqa: E402
import torch  # noqa: E402
import wire  # noqa: E402


class Driver:
    """One real Scheduler; answers ops at its iteration boundaries."""

    def __init__(self, adapter, out) -> None:
        self.adapter, self.out = adapter, out
        self.scheduler = None
        self.io: seams.Inputs | None = None
        self.stepping, self.iterations = False, 0

    def write(self, **answer) -> None:
        self.out.write(wire.line(answer) + "\n")
        self.out.flush()

    def configure(self, cfg: dict) -> None:
        self.scheduler = self.adapter.build(cfg)
        self.io = seams.Inputs(self.scheduler, self.adapter)
        self.io.observe = bool(cfg.get("observe", True))  # False: only step (the benchmark)
        self.adapter.set_receiver(self.scheduler, self.boundary)
        self.adapter.set_output(self.scheduler, self.io.record)
        runner = self.scheduler.tp_worker.model_runner
        result = dict(defaulted=sorted(runner.defaulted))
        if hybrid.kind(cfg) != "plain":  # what the release's own pool code built
            result["built"] = hybrid.describe(self.scheduler)
        self.write(views=[], result=result)

    def boundary(self, local_reqs=None) -> list:
        """Called by SGLang's loop at the top of each iteration: answer the step that just
        ran, then take ops until the next step (an ``end`` or the end of input: exit)."""
        if self.stepping:
            self.stepping = False
            self.iterations += 1
            self.write(**self.io.step_answer(self.iterations))
        handed = list(local_reqs or [])
        for op in read_ops():
            if op.get("op") == "step":
                self.stepping = True
                return handed + self.io.take_pending()
            if op.get("op") == "end":
                break
            try:
                views, result = self.io.apply(op, self.iterations)
                self.write(views=views, result=result)
            except (KeyError, ValueError) as exc:
                self.write(error=f"{type(exc).__name__}: {exc}")
        self.write(views=[], result="ended")
        os._exit(0)  # the trace's child: nothing of it outlives the trace


def read_ops():
    """The ops on stdin, one JSON object per line (``readline``: never reads ahead of the
    trace's own ops, which a forked child shares with its parent)."""
    while line := sys.stdin.readline():
        if line.strip():
            yield json.loads(line)


def say(**answer) -> None:
    sys.stdout.write(wire.line(answer) + "\n")
    sys.stdout.flush()


def run_trace(adapter, cfg: dict) -> None:
    """A forked child: one real Scheduler, its event loop until the trace ends."""
    driver = Driver(adapter, sys.stdout)
    try:
        driver.configure(cfg)
        driver.scheduler.run_event_loop()
    except Exception as exc:  # reported with the op that ran into it; the child ends
        say(**failure(exc))
    os._exit(1)


def banner():
    """The adapter and the first line: which adapter drives the release and why, or a drift
    naming what no adapter drives (a probe's answer, or an adapter module that does not
    import) and the adapter it concerns."""
    version = sglang.__version__
    try:
        module, probes = release_probes.probe_all()
    except release_probes.Drift as exc:
        drift = dict(drift=True, error=str(exc), adapter=exc.adapter)
        return None, dict(ready=False, version=version, **drift)
    try:
        adapter = importlib.import_module(module).Adapter(probes)
    except Exception as exc:  # the adapter itself does not import: the release moved
        said = failure(exc)
        said["error"] = f"{said['error']} (adapter: {module})"
        return None, dict(said, ready=False, version=version, adapter=module)
    return adapter, release_probes.banner(version, module, probes)


def preload() -> None:
    """Import what every trace's Scheduler imports (the model registry imports every model
    class: ~2 s) once, here, so each forked child inherits it instead of importing it again."""
    try:
        importlib.import_module("sglang.srt.models.registry")
    except Exception:  # a release without it: each child imports what it needs
        pass


def main() -> None:
    torch.set_num_threads(1)  # tiny tensors; and a forked child must not inherit a thread pool
    adapter, said = banner()
    say(**said)
    if adapter is None:
        return
    preload()
    for op in read_ops():
        if op.get("op") != "config":
            say(error=f"op {op.get('op')!r} before a config")
            continue
        if op.get("speculative") and "speculative" not in said["supports"]:
            why = adapter.probes.banner()["speculative"]
            say(error=f"speculative: {said['adapter']} does not drive it here ({why})")
            continue
        refused = [k for k in ("swa", "mla") if op.get(k) and k not in said["supports"]]
        if refused:
            why = adapter.probes.banner()["kv_pools"]
            say(error=f"{refused[0]}: {said['adapter']} does not build these pools ({why})")
            continue
        child = os.fork()
        if child == 0:
            run_trace(adapter, op)
        os.waitpid(child, 0)


def failure(exc: Exception) -> dict:
    """An exception that ended the trace's child, as its answer (driverlib/answers.py: drift
    in the adapter or the state reader, a crash in SGLang's own code, else a refusal)."""
    return dict(answers.failure(exc, OURS, "sglang"), ended=True)


if __name__ == "__main__":
    main()
