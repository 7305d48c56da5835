"""Launches the real-scheduler driver (``driver/sched_main.py``) under one SGLang release's
venv and speaks JSON lines with it.

Keeps: one venv per release, built by ``make sglang-env SGLANG_VERSION=V`` (0.5.23, the
default, in ``.sglang-venv``; any other in ``.sglang-venv-<V>``); the interpreter is the
explicit one (``--sglang-python``), else ``$KVSPEC_SGLANG_PYTHON`` when no release is named,
else the release's venv. A release whose internals moved — an attribute, an import or a
signature a shim relies on — is ``ShimDrift``: one line naming the error, where in the shim,
and the shim module; never a traceback, never a finding.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from invariants.targets.sglang.target import ENV_VAR, ROOT, DriverError, SGLangUnavailable

DRIVER_DIR = Path(__file__).resolve().parent / "driver"
MAIN = DRIVER_DIR / "main.py"
DEFAULT_VERSION = "0.5.23"
STARTUP_SECONDS = 180


class ShimDrift(RuntimeError):
    """The release's internals moved under a shim (exit 2; not a finding)."""


class SGLangCrash(DriverError):
    """SGLang's own code raised during an iteration (a finding: the run's error)."""


def venv_dir(version: str) -> Path:
    name = ".sglang-venv" if version == DEFAULT_VERSION else f".sglang-venv-{version}"
    return ROOT / name


def shim_path(version: str) -> Path:
    return DRIVER_DIR / f"shim_{version.replace('.', '_')}.py"


def supported_versions() -> list[str]:
    """Releases with a shim module (``driver/shim_<version>.py``)."""
    names = sorted(path.stem.removeprefix("shim_") for path in DRIVER_DIR.glob("shim_*.py"))
    return [_dotted(name) for name in names if name[0].isdigit()]  # not shim_common*


def _dotted(name: str) -> str:
    """``0_5_10_post1`` → ``0.5.10.post1``."""
    return name.replace("_", ".")


def installed_versions() -> list[str]:
    """Releases whose venv was built here (its stamp names the release), oldest first."""
    found = []
    for stamp in ROOT.glob(".sglang-venv*/.installed"):
        for word in stamp.read_text().split():
            if word.startswith("sglang=="):
                found.append(word.removeprefix("sglang=="))
    return sorted(set(found), key=_release_key)


def _release_key(version: str) -> tuple[int, ...]:
    parts = version.replace(".post", ".").split(".")
    return tuple(int(p) if p.isdigit() else 0 for p in parts)


def scheduler_python(version: str | None = None, explicit: str | Path | None = None) -> Path:
    """The interpreter for ``version`` (see the module docstring for the order)."""
    if explicit:
        return Path(explicit)
    if version is None and os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return venv_dir(version or DEFAULT_VERSION) / "bin" / "python"


class SchedulerDriver:
    """One driver process (SGLang imported once); each trace runs in a child it forks at the
    trace's ``config`` and ends at ``end()``. ``send(op)`` returns an op's answer."""

    def __init__(self, version: str | None = None, python: str | Path | None = None) -> None:
        self.python = scheduler_python(version, python)
        if python is None and version is not None and version not in supported_versions():
            raise SGLangUnavailable(
                f"no shim for sglang {version} (supported: {', '.join(supported_versions())}; "
                f"a release's shim is invariants/targets/sglang_scheduler/driver/shim_<version>.py)"
            )
        if not self.python.exists():
            hint = f" SGLANG_VERSION={version}" if version and version != DEFAULT_VERSION else ""
            raise SGLangUnavailable(
                f"no sglang interpreter at {self.python}: run `make sglang-env{hint}`, or "
                f"point --sglang-python at a python with that release"
            )
        self.log = tempfile.TemporaryFile(mode="w+")  # SGLang's own logging, shown on a death
        self.proc = subprocess.Popen(
            [str(self.python), str(MAIN)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )
        banner = self._read("startup")
        if not banner.get("ready"):
            self.close()
            raise self._refusal(banner, "startup")
        self.version: str = banner["sglang"]
        self.shim: str = banner["shim"]
        # catalog ids the release's design does not promise (shim's NOT_APPLICABLE): id -> why
        self.not_applicable: dict[str, str] = banner.get("not_applicable", {})
        if version is not None and self.version != version:
            self.close()
            raise SGLangUnavailable(f"{self.python} has sglang {self.version}, not {version}")
        self.defaulted: list[str] = []
        self.in_trace = False  # a trace's child is running (between config and end)

    def _read(self, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=30)
            raise SGLangUnavailable(
                f"the sglang-scheduler driver exited ({code}) during {what}: {self._log_tail()}"
            )
        return json.loads(line)

    def _log_tail(self, lines: int = 3) -> str:
        self.log.seek(0)
        tail = [line.strip() for line in self.log.read().splitlines() if line.strip()]
        return " | ".join(tail[-lines:]) or "(no output)"

    def _refusal(self, answer: dict[str, Any], what: str) -> Exception:
        error, where = answer["error"], answer.get("where", "")
        if answer.get("drift"):
            version = answer.get("sglang") or getattr(self, "version", "")
            shim = shim_path(version).relative_to(ROOT)
            at = f" at {where}" if where else ""
            return ShimDrift(f"sglang {version}: {error}{at} (shim module: {shim})")
        at = f" (last driver frame: {where})" if where else ""
        return SGLangCrash(f"{what}: {error}{at}")

    def send(self, op: dict[str, Any]) -> dict[str, Any]:
        """One op; its answer (``views``, ``result``, ``sglang``). A refused op raises
        DriverError, a moved release ShimDrift, a crash in SGLang's code SGLangCrash (the
        trace's child has ended then; the driver takes the next ``config``)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(op) + "\n")
        except BrokenPipeError:
            raise SGLangUnavailable(f"the driver is gone: {self._log_tail()}") from None
        answer = self._read(f"op {op['op']}")
        if "error" in answer:
            if "trace" in answer:
                self.in_trace = False
                raise self._refusal(answer, f"op {op['op']}")
            raise DriverError(f"op {json.dumps(op)[:160]}: {answer['error']}")
        if op["op"] == "config":
            self.in_trace, self.defaulted = True, answer["result"]["defaulted"]
        return answer

    def end(self) -> None:
        """End the trace's child (a no-op when it has ended by itself)."""
        if self.in_trace:
            self.in_trace = False
            self.send({"op": "end"})

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> SchedulerDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
