"""SGLang's releases as the sglang-scheduler target runs them: one venv per release, one shim per
release, and the driver (``driver/main.py``) under the release's interpreter.

Keeps: one venv per release, built by ``make sglang-env SGLANG_VERSION=V`` (0.5.23, the
default, in ``.sglang-venv``; any other in ``.sglang-venv-<V>``); the interpreter is the
explicit one (``--target-python``), else ``$KVSPEC_SGLANG_PYTHON`` when no release is named,
else the release's venv. A release whose internals moved — an attribute, an import or a
signature a shim relies on — is ``AdapterDrift``: one line naming the error, where in the
shim, and the shim module; never a traceback, never a finding.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from invariants.targets.driver import Answer, LineDriver, TargetUnavailable

ROOT = Path(__file__).resolve().parents[3]
DRIVER_DIR = Path(__file__).resolve().parent / "driver"
MAIN = DRIVER_DIR / "main.py"
ENV_VAR = "KVSPEC_SGLANG_PYTHON"
DEFAULT_VERSION = "0.5.23"


def venv_dir(version: str) -> Path:
    name = ".sglang-venv" if version == DEFAULT_VERSION else f".sglang-venv-{version}"
    return ROOT / name


def shim_path(version: str) -> Path:
    return DRIVER_DIR / f"shim_{version.replace('.', '_')}.py"


def supported_versions() -> list[str]:
    """Releases with a shim module (``driver/shim_<version>.py``)."""
    names = sorted(path.stem.removeprefix("shim_") for path in DRIVER_DIR.glob("shim_*.py"))
    return [name.replace("_", ".") for name in names if name[0].isdigit()]  # not shim_common*


def installed_versions() -> list[str]:
    """Releases whose venv was built here (its stamp names the release), oldest first."""
    found = []
    for stamp in ROOT.glob(".sglang-venv*/.installed"):
        for word in stamp.read_text().split():
            if word.startswith("sglang=="):
                found.append(word.removeprefix("sglang=="))
    return sorted(set(found), key=release_key)


def release_key(version: str) -> tuple[int, ...]:
    parts = version.replace(".post", ".").split(".")
    return tuple(int(p) if p.isdigit() else 0 for p in parts)


def scheduler_python(version: str | None = None, explicit: str | Path | None = None) -> Path:
    """The interpreter for ``version`` (see the module docstring for the order)."""
    if explicit:
        return Path(explicit)
    if version is None and os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return venv_dir(version or DEFAULT_VERSION) / "bin" / "python"


class SchedulerDriver(LineDriver):
    """One driver process (SGLang imported once); each trace runs in a child it forks at the
    trace's ``config`` and ends at ``end()`` (or by itself, when SGLang's code raised)."""

    def __init__(self, version: str | None = None, python: str | Path | None = None) -> None:
        chosen = scheduler_python(version, python)
        if python is None and version is not None and version not in supported_versions():
            raise TargetUnavailable(
                f"no shim for sglang {version} (supported: {', '.join(supported_versions())}; "
                f"a release's shim is {shim_path('<version>').relative_to(ROOT)})"
            )
        if not chosen.exists():
            hint = f" SGLANG_VERSION={version}" if version and version != DEFAULT_VERSION else ""
            raise TargetUnavailable(
                f"no sglang interpreter at {chosen}: run `make sglang-env{hint}`, or point "
                f"--target-python at a python with that release"
            )
        super().__init__("sglang-scheduler", chosen, MAIN)
        self.shim: str = self.banner["shim"]
        if version is not None and self.version != version:
            self.close()
            raise TargetUnavailable(f"{chosen} has sglang {self.version}, not {version}")
        self.defaulted: list[str] = []  # model config fields SGLang filled in
        self.in_trace = False  # a trace's child is running (between config and end)

    def adapter_hint(self, answer: Answer) -> str:
        version = getattr(self, "version", "") or self.banner.get("version", "")
        return f" (shim module: {shim_path(version).relative_to(ROOT)})"

    def answered(self, op: dict[str, Any], answer: Answer) -> None:
        """A config starts a trace's child; an answer that ended it says so."""
        if answer.get("ended"):
            self.in_trace = False
        elif op["op"] == "config" and "error" not in answer:
            self.in_trace, self.defaulted = True, answer["result"]["defaulted"]

    def end(self) -> None:
        """End the trace's child (a no-op when it has ended by itself)."""
        if self.in_trace:
            self.in_trace = False
            self.ask({"op": "end"})
