"""SGLang's releases as the sglang-scheduler target runs them: one venv per release, and the
driver (``driver/main.py``) under the release's interpreter, which picks the adapter that
drives it by probing the installed code (``driver/release_probes.py``) — any release, or a
checkout, whose code an adapter matches runs.

Keeps: one venv per release, built by ``make sglang-env SGLANG_VERSION=V`` (0.5.23, the
default, in ``.sglang-venv``; any other in ``.sglang-venv-<V>``); the interpreter is the
explicit one (``--target-python``), else ``$KVSPEC_SGLANG_PYTHON`` when no release is named,
else the release's venv. The driver's banner names its adapter and each probe's answer; what
it drives beyond the plain features (``supports``) is kept per release for the checks made
before a trace runs. A release whose internals moved — an attribute, an import or a
signature no adapter drives — is ``AdapterDrift``: one line naming the error, where in the
driver, and the adapter module; never a traceback, never a finding.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from invariants.targets.driver import Answer, LineDriver, TargetUnavailable
from invariants.targets.registry import stamped_releases

ROOT = Path(__file__).resolve().parents[3]
DRIVER_DIR = Path(__file__).resolve().parent / "driver"
MAIN = DRIVER_DIR / "main.py"
ENV_VAR = "KVSPEC_SGLANG_PYTHON"
DEFAULT_VERSION = "0.5.23"


def venv_dir(version: str) -> Path:
    name = ".sglang-venv" if version == DEFAULT_VERSION else f".sglang-venv-{version}"
    return ROOT / name


def adapter_path(module: str) -> Path:
    """The driver module an adapter's name (a banner's ``adapter``) stands for."""
    return DRIVER_DIR / f"{module}.py"


# release -> the engine features beyond the plain ones its driver's banner said it drives
# (filled as drivers start; a release no driver has answered for yet is absent)
SUPPORTS_SEEN: dict[str, frozenset[str]] = {}


def installed_versions() -> list[str]:
    """Releases whose venv was built here (its stamp names the release), oldest first."""
    return stamped_releases(ROOT, "sglang")


def scheduler_python(version: str | None = None, explicit: str | Path | None = None) -> Path:
    """The interpreter for ``version`` (see the module docstring for the order)."""
    if explicit:
        return Path(explicit)
    if version is None and os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return venv_dir(version or DEFAULT_VERSION) / "bin" / "python"


class SchedulerDriver(LineDriver):
    """One driver process (SGLang imported once); each trace runs in a child it forks at the
    trace's ``config`` and ends at ``end()`` (or by itself, when SGLang's code raised). A
    target with another script under the same venvs (sglang-server) names it here."""

    NAME, SCRIPT = "sglang-scheduler", MAIN

    def __init__(self, version: str | None = None, python: str | Path | None = None) -> None:
        chosen = scheduler_python(version, python)
        if not chosen.exists():
            hint = f" SGLANG_VERSION={version}" if version and version != DEFAULT_VERSION else ""
            raise TargetUnavailable(
                f"no sglang interpreter at {chosen}: run `make sglang-env{hint}`, or point "
                f"--target-python at a python with that release"
            )
        super().__init__(self.NAME, chosen, self.SCRIPT)
        self.adapter: str = self.banner.get("adapter", "")
        self.probes: dict[str, str] = self.banner.get("probes", {})
        SUPPORTS_SEEN[self.version] = frozenset(self.banner.get("supports", ()))
        if version is not None and self.version != version:
            self.close()
            raise TargetUnavailable(f"{chosen} has sglang {self.version}, not {version}")
        self.defaulted: list[str] = []  # model config fields SGLang filled in
        self.built: dict[str, Any] = {}  # hybrid SWA / MLA: the pool classes the release built
        self.in_trace = False  # a trace's child is running (between config and end)

    def adapter_hint(self, answer: Answer) -> str:
        """The adapter module to mend: the one the drift names, else the banner's."""
        module = answer.get("adapter") or getattr(self, "banner", {}).get("adapter")
        if not module or not adapter_path(module).exists():
            return ""
        return f" (adapter module: {adapter_path(module).relative_to(ROOT)})"

    def answered(self, op: dict[str, Any], answer: Answer) -> None:
        """A config starts a trace's child; an answer that ended it says so."""
        if answer.get("ended"):
            self.in_trace = False
        elif op["op"] == "config" and "error" not in answer:
            self.in_trace, self.defaulted = True, answer["result"]["defaulted"]
            self.built = answer["result"].get("built", {})

    def end(self) -> None:
        """End the trace's child (a no-op when it has ended by itself)."""
        if self.in_trace:
            self.in_trace = False
            self.ask({"op": "end"})
