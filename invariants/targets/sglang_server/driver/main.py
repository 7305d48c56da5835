"""The sglang-server target's driver: SGLang's REAL HTTP server — ``launch_server``'s FastAPI
app and TokenizerManager, its Scheduler and DetokenizerManager processes on their own ZMQ
sockets — with only the model worker faked, reached through SGLang's own plugin entry point
(hook/). Speaks kvspec's JSON-line protocol (the sglang-scheduler driver's, main.py there):
one server per trace, started at its ``config`` op and stopped at its ``end``.

Keeps: every op of the trace is a real HTTP call (client.py); the scheduler's receive is held
at each iteration (gate.py, in the scheduler process), and an op is done when its input has
reached that receive (or its call ended without reaching it), so the ops between two steps
land in one receive; a step is one iteration of SGLang's loop, its answer the views and
checks read inside the scheduler process, plus the ``response`` view of every request it
finished (the HTTP answer, awaited). Runs in the sglang venv; imports nothing of kvspec.

  in:  the sglang-scheduler driver's ops; an abort with ``"disconnect": true`` is the client
       of ``rid`` going away (SGLang aborts it when it notices), not a call to /abort_request
  out: the same answers; the config's result adds the server's ``command`` and ``port``
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in __import__("launch").PATH]
import stubs  # noqa: E402

stubs.install()

import client  # noqa: E402
import launch  # noqa: E402
import release_probes  # noqa: E402
import sglang  # noqa: E402
from control import Control  # noqa: E402
from responses import Responses  # noqa: E402

READY_TIMEOUT = float(os.environ.get("KVSPEC_SERVER_READY_TIMEOUT", "180"))
SETTLE_TIMEOUT = 30.0  # seconds an op's input may take to reach the scheduler
DISCONNECT_POLL = 3.0  # SGLang checks a waiting client every 1 s (launch.py sets it)
ANSWER_TIMEOUT = 60.0  # seconds a finished request's HTTP answer may take to arrive


class DriverFailure(Exception):
    """The run cannot go on: ``answer`` is the error answer that ends the trace."""

    def __init__(self, answer: dict) -> None:
        super().__init__(answer.get("error", ""))
        self.answer = dict(answer, ended=True)


def failed(error: str) -> DriverFailure:
    return DriverFailure(dict(error=error))


def say(**answer) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


class Run:
    """One trace: one server, its gate's control connection, the client's calls."""

    def __init__(self, cfg: dict) -> None:
        self.calls: dict = {}  # rid -> its HTTP call
        self.folder = tempfile.mkdtemp(prefix="kvspec-server-")
        self.responses = Responses(cfg["seed"], (cfg["eos_id"], cfg["eos_prob"]))
        self.sched: dict = {}  # the latest step view's scheduler fields (the rules read them)
        self.iterations = 0
        path = os.path.join(self.folder, "control")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        port = int(os.environ.get("KVSPEC_SERVER_PORT") or launch.free_port())
        try:
            self.server = launch.Server(cfg, port, path, os.path.join(self.folder, "server.log"))
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        try:
            self.control = self._accept(listener)
            self.server.wait_ready(READY_TIMEOUT)
            self.ask({"op": "hold"})
        except BaseException:
            self.stop()
            raise

    def _accept(self, listener: socket.socket):
        """The gate's connection and its banner (a drift ends the start-up)."""
        listener.settimeout(1.0)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            try:
                sock, _ = listener.accept()
                break
            except TimeoutError:
                if not self.server.alive():
                    raise launch.LaunchError(
                        f"the server exited at start-up: {self.server.log_tail()}"
                    ) from None
        else:
            raise launch.LaunchError(
                f"no scheduler process after {READY_TIMEOUT:.0f} s "
                f"(KVSPEC_SERVER_READY_TIMEOUT): {self.server.log_tail()}"
            )
        control = Control(sock)
        banner = control.read() or {}
        if not banner.get("ready"):
            raise DriverFailure(banner)
        return control

    def ask(self, op: dict) -> dict:
        self.control.say(**op)
        answer = self.control.read()
        if answer is None:
            raise failed(f"the scheduler process is gone: {self.server.log_tail()}")
        if answer.get("ended"):
            raise DriverFailure(answer)
        return answer

    # ---- the trace's ops ----

    def apply(self, op: dict) -> dict:
        kind = op["op"]
        if kind == "step":
            return self.step()
        if kind == "abort" and op.get("disconnect"):
            return self.disconnect(op["rid"])
        if kind == "abort" and not op.get("rid"):  # by phase and pick: the gate resolves it
            picked = {"op": "pick", "phase": op.get("phase", "any"), "pick": op.get("pick", 0)}
            op = dict(op, rid=self.ask(picked)["result"])
            if op["rid"] is None:
                return dict(views=[], result=None)
        if kind in ("submit", "open_session", "close_session", "abort", "flush_cache"):
            return self.send(op)
        return self.ask(op)  # idle, unfinished, stats, advance_clock: the gate answers

    def send(self, op: dict) -> dict:
        """An op's HTTP call, done when its input reached the scheduler's receive."""
        kind = op["op"]
        if kind == "submit" and op["rid"] in self.calls:
            return dict(views=[], result=None)  # a reused rid is skipped (kvspec's runner)
        call, key = client.op_call(self.server.port, op)
        if kind == "submit":
            self.calls[op["rid"]] = call
            self.responses.submitted(op)
        elif kind == "open_session":
            self.responses.opened(op["session_id"], op.get("streaming", False))
        elif kind == "flush_cache":
            self.responses.flushed()
        self.settle(call, key, op)
        views = []
        if kind == "submit" and call.done():  # refused before it reached the scheduler
            view = self.responses.view(op["rid"], call, self.iterations, self.sched)
            views += [] if view is None else [view]
        return dict(views=views, result=op.get("rid") if kind == "abort" else None)

    def settle(self, call: client.Call, key: list[str], op: dict, grace: float = 0.3) -> bool:
        """Poll the held receive until ``key`` arrived (True), or the call ended without it
        ``grace`` seconds ago (False)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        ended_at = None
        while time.monotonic() < deadline:
            if key in self.ask({"op": "poll", "seconds": 0.05})["result"]:
                return True
            if call.done():
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > grace:
                    return False
        late = f"its input did not reach the scheduler in {SETTLE_TIMEOUT:.0f} s"
        raise failed(f"op {op['op']}: {late} ({call.error or call.status})")

    def disconnect(self, rid: str) -> dict:
        """The client of ``rid`` hangs up; done when SGLang's abort of it reached the
        receive (result: the rid), or SGLang did not abort it within its disconnect poll
        (result: None) — a request already finished, or one SGLang let run on."""
        call = self.calls.get(rid)
        if call is None or call.done():
            return dict(views=[], result=None)
        call.disconnect()
        aborted = self.settle(call, ["AbortReq", rid], {"op": "disconnect"}, DISCONNECT_POLL)
        return dict(views=[], result=rid if aborted else None)

    def step(self) -> dict:
        answer = self.ask({"op": "step"})
        self.iterations += 1
        if answer.get("views"):
            self.sched = answer["views"][0].get("sched", self.sched)
        batch = answer.get("batch") or {}
        for rid in batch.get("finished", ()):
            call = self.calls.get(rid)
            if call is None or call.disconnected:
                continue
            if not call.wait(ANSWER_TIMEOUT):
                late = f"no HTTP answer {ANSWER_TIMEOUT:.0f} s after SGLang finished it"
                raise failed(f"{rid}: {late}")
            view = self.responses.view(rid, call, self.iterations, self.sched)
            answer["views"] += [] if view is None else [view]
        return answer

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def banner() -> dict:
    """The driver's first line: the release's probes, as the sglang-scheduler driver's."""
    version = sglang.__version__
    try:
        module, probes = release_probes.probe_all()
    except release_probes.Drift as exc:
        return dict(ready=False, version=version, drift=True, error=str(exc), adapter=exc.adapter)
    if importlib.util.find_spec("sglang.srt.plugins") is None:
        return dict(
            ready=False,
            version=version,
            error=f"sglang {version} has no plugin entry point (sglang.srt.plugins): "
            "the server target needs 0.5.11 or later",
        )
    # the server target drives the plain features only (no EAGLE, SWA, MLA)
    return dict(release_probes.banner(version, module, probes), supports=[])


def read_ops():
    while line := sys.stdin.readline():
        if line.strip():
            yield json.loads(line)


def serve_trace(cfg: dict) -> None:
    """One trace, from its config op to its end (or the answer that ended it)."""
    try:
        run = Run(cfg)
    except launch.LaunchError as exc:  # a set-up problem, not a finding (exit 2)
        return say(error=str(exc), ended=True, unavailable=True)
    except DriverFailure as exc:
        return say(**exc.answer)
    say(views=[], result=dict(defaulted=[], command=run.server.argv, port=run.server.port))
    ending: dict = dict(views=[], result="ended")
    try:
        for op in read_ops():
            if op["op"] == "end":
                break
            try:
                say(**run.apply(op))
            except (KeyError, ValueError) as exc:
                say(error=f"{type(exc).__name__}: {exc}")
        else:
            ending = {}  # kvspec is gone: nobody to answer
    except DriverFailure as exc:
        ending = exc.answer
    finally:
        run.stop()  # before the answer: when kvspec hears the trace ended, its server is gone
    if ending:
        say(**ending)


def main() -> None:
    said = banner()
    say(**said)
    if not said["ready"]:
        return
    for op in read_ops():
        if op.get("op") != "config":
            say(error=f"op {op.get('op')!r} before a config")
            continue
        serve_trace(op)


if __name__ == "__main__":
    main()
