"""Launches the sglang driver subprocess and speaks JSON lines with it (ops in, views out).

Keeps: isolation — the driver runs under the sglang venv's own python (its own torch and
transformers pins) and kvspec never imports sglang. The interpreter is, in order: the
explicit argument (``--sglang-python``), ``$KVSPEC_SGLANG_PYTHON``, ``.sglang-venv/bin/python``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).resolve().parent / "driver" / "main.py"
ENV_VAR = "KVSPEC_SGLANG_PYTHON"
SGLANG_VERSION = "0.5.23"  # the version the driver's glue follows


class SGLangUnavailable(RuntimeError):
    """No usable sglang interpreter; the message says how to get one."""


class DriverError(RuntimeError):
    """The driver refused or failed an op; names the op."""


def sglang_python(explicit: str | Path | None = None) -> Path:
    """The interpreter of the sglang venv (see the module docstring for the order)."""
    chosen = explicit or os.environ.get(ENV_VAR) or ROOT / ".sglang-venv" / "bin" / "python"
    return Path(chosen)


def unavailable_reason(python: Path) -> str | None:
    """Why the sglang target cannot run with ``python`` (None: it can)."""
    if not python.exists():
        return (
            f"no sglang interpreter at {python}: run `make sglang-env`, or point "
            f"--sglang-python / ${ENV_VAR} at a python with sglang {SGLANG_VERSION}"
        )
    return None


class LineDriver:
    """A driver subprocess speaking JSON lines under another venv's python: ``send(op)``
    returns the views that op produced, ``result`` the op's own answer, ``faults`` what an
    injected fault did; ``banner`` is its first line (``version`` under ``banner_key``)."""

    name = "sglang"
    banner_key = "sglang"
    unavailable: type[RuntimeError] = SGLangUnavailable

    def __init__(self, python: Path, script: Path) -> None:
        self.python, self.script = python, script
        self.faults: list[dict[str, Any]] = []
        self.result: Any = None
        self.proc = subprocess.Popen(
            [str(self.python), str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.banner = self._read("startup")
        if not self.banner.get("ready"):
            raise self.unavailable(f"{self.name} driver did not start: {self.banner}")
        self.version: str = self.banner[self.banner_key]

    def _read(self, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=30)
            raise self.unavailable(
                f"{self.name} driver exited ({code}) during {what}; run "
                f"`{self.python} {self.script}` by hand to see why"
            )
        return json.loads(line)

    def send(self, op: dict[str, Any]) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(op) + "\n")
        answer = self._read(f"op {op.get('op')}")
        if "error" in answer:
            raise DriverError(f"op {json.dumps(op)[:160]}: {answer['error']}")
        self.faults = answer.get("faults", [])
        self.result = answer.get("result")
        return answer["views"]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self) -> LineDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SGLangDriver(LineDriver):
    """The sglang target's driver (driver/main.py, SGLang's memory classes)."""

    def __init__(self, python: str | Path | None = None) -> None:
        chosen = sglang_python(python)
        reason = unavailable_reason(chosen)
        if reason:
            raise SGLangUnavailable(reason)
        super().__init__(chosen, DRIVER)
        self.stubs: list[str] = self.banner["stubs"]
