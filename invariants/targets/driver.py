"""A real engine's driver process: a script under the engine's own interpreter (its own venv,
torch and pins), speaking JSON lines with kvspec — one op in, one answer out.

Keeps: isolation — kvspec never imports a real engine; everything it knows of one comes through
this pipe. One class for every target: the first line is the driver's banner (``ready``, the
engine's release as ``version``, and what the adapter declares: the catalog ids the release
does not promise, ``not_applicable``); each answer is ``{"views", "result", ...}``
or ``{"error", ...}``. An error answer is classified here, once, for every target:

  ``drift``  the adapter's own code met an attribute, import or signature that is not there —
             the release's internals moved (``AdapterDrift``: exit 2, never a finding);
  ``crash``  the engine's own code raised (``EngineCrash``: a finding, the ``crash`` event);
  else       the driver refused the op (``DriverError``: the run's error, named with its op).

The driver runs in its own folder (no package of the caller's working directory can shadow the
engine's imports) and its stderr goes to a log whose tail names why, should it die.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any

import orjson

Answer = dict[str, Any]
VIEWS = "\x1e"  # a line's head and its views, apart (driverlib/wire.py answer_line)
RAW_VIEWS = "_views_json"  # an answer's views not decoded yet (``collect(lazy=True)``)


class TargetUnavailable(RuntimeError):
    """No usable interpreter, or the driver did not start (exit 2: a set-up problem)."""


class AdapterDrift(RuntimeError):
    """The release's internals moved under the adapter (exit 2; never a finding)."""


class DriverError(RuntimeError):
    """The driver refused or failed an op; the message names the op."""


class EngineCrash(DriverError):
    """The engine's own code raised: ``crash`` holds the driver's record of it (``error``:
    the exception's class, ``message``, ``site``: where in the engine's code it was raised)."""

    def __init__(self, message: str, crash: dict[str, Any]) -> None:
        super().__init__(message)
        self.crash = crash


def views_of(answer: Answer) -> list[dict[str, Any]]:
    """An answer's views, decoded now if ``collect`` left them as JSON."""
    raw = answer.pop(RAW_VIEWS, None)
    if raw is not None:
        answer["views"] = orjson.loads(raw)
    return answer.get("views", [])


class LineDriver:
    """One driver subprocess of ``target`` (``python script``). ``ask(op)`` returns the op's
    answer, keeping its ``result`` and ``faults`` (what an injected fault did); ``send(op)``
    its views; ``version`` is the engine's release as the banner names it."""

    def __init__(self, target: str, python: Path, script: Path) -> None:
        # absolute (the driver runs in its own folder), never resolved (a venv's python is a
        # symlink whose folder names the venv)
        python = Path(python).absolute()
        self.target, self.python, self.script = target, python, script
        self.faults: list[dict[str, Any]] = []
        self.result: Any = None
        self.posted: list[dict[str, Any]] | None = None  # a list: every op posted is kept
        self.log = tempfile.TemporaryFile(mode="w+")  # the engine's own logging
        self.proc = subprocess.Popen(
            [str(python), str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
            cwd=script.parent,
            # str hashes pinned (0 unless told): vLLM's block hashes start from them and every
            # set a driver walks is ordered by them — one seed, one run on every machine
            env=os.environ | {"PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")},
        )
        try:
            self.banner = self._read("startup")
        except TargetUnavailable:  # (it died before its banner: nothing else will close it)
            self.close()
            raise
        if not self.banner.get("ready"):
            self.close()
            raise self.refusal(self.banner, "startup")
        self.version: str = self.banner["version"]
        self.not_applicable: dict[str, str] = self.banner.get("not_applicable", {})

    def _read(self, what: str, lazy: bool = False) -> Answer:
        """The next answer (``lazy``: its views left as JSON under ``RAW_VIEWS``, for
        ``views_of`` to decode)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=30)
            raise TargetUnavailable(
                f"the {self.target} driver exited ({code}) during {what}: {self.log_tail()}"
            )
        head, split, views = line.partition(VIEWS)
        answer = orjson.loads(head)  # (json's values, several times faster on a view)
        if split:
            answer[RAW_VIEWS] = views
            if not lazy:
                views_of(answer)
        return answer

    def log_tail(self, lines: int = 3) -> str:
        """The last lines the driver wrote to stderr (why it died, mostly)."""
        self.log.seek(0)
        tail = [line.strip() for line in self.log.read().splitlines() if line.strip()]
        return " | ".join(tail[-lines:]) or f"run `{self.python} {self.script}` to see why"

    def refusal(self, answer: Answer, what: str) -> Exception:
        """An error answer as the exception its kind calls for (see the module docstring)."""
        error, where = answer.get("error", answer), answer.get("where", "")
        if answer.get("drift"):
            version = answer.get("version") or getattr(self, "version", "")
            at = f" at {where}" if where else ""
            return AdapterDrift(f"{self.target} {version}: {error}{at}{self.adapter_hint(answer)}")
        if what == "startup":
            return TargetUnavailable(f"the {self.target} driver did not start: {error}")
        if answer.get("crash"):
            return EngineCrash(f"{what}: {error}", answer["crash"])
        return DriverError(f"{what}: {error}")

    def adapter_hint(self, answer: Answer) -> str:
        """Where to mend the adapter for a moved release (a target's driver says more)."""
        return ""

    def ask(self, op: dict[str, Any]) -> Answer:
        """One op; its answer. An error answer raises (see ``refusal``)."""
        self.post(op)
        return self.collect(op)

    def post(self, op: dict[str, Any]) -> None:
        """Send one op without waiting: the driver works on it while this side does something
        else (checks the last answer); ``collect`` reads its answer, before any other post."""
        assert self.proc.stdin is not None
        if self.posted is not None:
            self.posted.append(op)
        try:
            self.proc.stdin.write(json.dumps(op) + "\n")
        except BrokenPipeError:
            gone = f"the {self.target} driver is gone: {self.log_tail()}"
            raise TargetUnavailable(gone) from None

    def collect(self, op: dict[str, Any], lazy: bool = False) -> Answer:
        """The answer of the op posted last (an error answer raises: see ``refusal``;
        ``lazy``: its views are decoded by ``views_of``, when they are checked)."""
        answer = self._read(f"op {op.get('op')}", lazy)
        self.answered(op, answer)
        if "error" in answer:
            raise self.refusal(answer, f"op {op.get('op')}")
        self.result = answer.get("result")
        self.faults = answer.get("faults", self.faults)
        return answer

    def answered(self, op: dict[str, Any], answer: Answer) -> None:
        """Sees every answer before it is returned or raised (a driver that keeps per-trace
        state follows it here)."""

    def send(self, op: dict[str, Any]) -> list[Answer]:
        """One op; the views it produced (its ``result`` and ``faults`` kept)."""
        return self.ask(op)["views"]

    def end(self) -> None:
        """End one trace (a driver that forks one child per trace ends it here)."""

    def close(self) -> None:
        """End the driver (its stdin closed: it exits; killed if it does not within a minute)
        and close both pipes and the log, whether it was running or had exited already."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with suppress(OSError):  # (a pipe closed already closes again quietly)
                pipe.close()  # type: ignore[union-attr]
        self.log.close()

    def __enter__(self) -> LineDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
