"""Every real engine kvspec checks, one entry each: what it is called on the command line, what
runs real and what is faked, where its interpreter comes from, how its runs are checked, and the
adapter module the rest of kvspec reaches it through (the ``Adapter`` protocol below: its
driver, what it cannot run, its config op, how its views decode, what its runs say beside the
verdict, how the explorer draws its seeds).

Keeps: adding an engine is its folder (``targets/<name>/``: ``adapter.py`` and the ``driver/``
that runs under the engine's own interpreter) plus one entry here; the command line, the report
and the explorer read their choices from this table, never from a list of their own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from invariants.checking.checker import Level

if TYPE_CHECKING:
    from engine.view import StateView
    from invariants.explore.swarm import Swarm
    from invariants.scenarios.ops import Trace
    from invariants.targets.drive import Drive
    from invariants.targets.driver import LineDriver


@dataclass(frozen=True, slots=True)
class TargetOptions:
    """Which engine a target runs: an explicit interpreter (a venv, your own checkout), else
    the release's venv (``version``: a target with one venv per release), else the default."""

    python: str | None = None
    version: str | None = None


class Adapter(Protocol):
    """What a target's ``adapter`` module provides (module-level functions; ``swarm`` and
    ``label`` only where the target explores; an ``anchor`` function where it runs the anchor
    workload on its own memory path, `kvspec bench anchor --target NAME`)."""

    def open_driver(self, options: TargetOptions) -> LineDriver:
        """A running driver; ``TargetUnavailable`` (one line: how to get one) when none can."""
        ...

    def unsupported(self, trace: Trace, version: str | None) -> list[str]:
        """Why the target cannot run ``trace`` (empty: it can), said before anything runs."""
        ...

    def config(self, trace: Trace, fault: dict[str, Any] | None, observe: bool) -> dict[str, Any]:
        """The driver's config op for ``trace``'s engine section (``observe`` False: the
        driver only steps, building no view — the benchmark's baseline)."""
        ...

    def decoder(self) -> Callable[[dict[str, Any]], StateView]:
        """A fresh decoder of one run's views (a target may keep state across its views)."""
        ...

    def notes(self, trace: Trace, drive: Drive) -> tuple[str, ...]:
        """What the run did differently from kvspec's, or counted beside it, in words."""
        ...

    def swarm(self, seed: int) -> Swarm:
        """The explorer's configuration and op mix of ``seed`` on this target."""
        ...

    def label(self, swarm: Swarm) -> str:
        """A seed's configuration on one line."""
        ...


@dataclass(frozen=True, slots=True)
class Target:
    """One real engine as a target (see the module docstring)."""

    name: str  # the --target value
    engine: str  # the engine, as titles name it
    runs: str  # what of it runs, in a few words (titles)
    faked: str  # what is faked (the targets table)
    adapter_module: str  # the module implementing adapter.Adapter
    python_env: str  # the environment variable naming its interpreter
    releases: bool = False  # one venv per release (--target-version picks it)
    level: int = Level.RECORD  # the level its runs check at unless told
    draws_outputs: bool = True  # its engine runs no model: the trace's seeded outputs are sent
    engine_checks: bool = False  # its driver records the engine's own checkers beside kvspec's
    explores: bool = True  # `kvspec explore --target NAME` (its adapter draws seeds)
    commands: str | None = None  # a module whose register(group) adds `kvspec <engine> ...`
    # a faster target running the same engine code: the explorer shrinks a finding there when
    # its failure key holds there too, then confirms the shrunk trace here
    shrinks_on: str | None = None
    shrink_runs: int = 120  # the explorer's shrink budget here: runs of this target

    def adapter(self) -> Adapter:
        """The adapter module, imported on first use (the CLI's help stays fast)."""
        return cast("Adapter", importlib.import_module(self.adapter_module))

    def installed_releases(self) -> list[str]:
        """The releases built here, oldest first (a target with one venv per release; its
        adapter's ``installed_releases``), else none."""
        if not self.releases:
            return []
        return list(getattr(self.adapter(), "installed_releases", list)())

    @property
    def title(self) -> str:
        return f"{self.engine} ({self.runs})"

    @property
    def group(self) -> str:
        """The command group of its own commands (`kvspec sglang ...`): the engine's name."""
        return self.engine.lower()


TARGETS: tuple[Target, ...] = (
    Target(
        "sglang", "SGLang", "memory classes", "the scheduler glue (kvspec's) and the model",
        "invariants.targets.sglang.adapter", "KVSPEC_SGLANG_PYTHON", explores=False,
        commands="invariants.targets.sglang.commands",
    ),
    Target(
        "sglang-scheduler", "SGLang", "real scheduler", "the model forward",
        "invariants.targets.sglang_scheduler.adapter", "KVSPEC_SGLANG_PYTHON", releases=True,
        level=Level.STRICT, draws_outputs=False, engine_checks=True,
        commands="invariants.targets.sglang_scheduler.commands",
    ),
    Target(
        "sglang-server", "SGLang", "real HTTP server", "the model forward",
        "invariants.targets.sglang_server.adapter", "KVSPEC_SGLANG_PYTHON", releases=True,
        level=Level.STRICT, draws_outputs=False, engine_checks=True,
        commands="invariants.targets.sglang_server.commands", shrinks_on="sglang-scheduler",
        shrink_runs=12,
    ),
    Target(
        "vllm", "vLLM", "real v1 scheduler", "the model runner's output",
        "invariants.targets.vllm.adapter", "KVSPEC_VLLM_PYTHON", releases=True,
    ),
)  # fmt: skip
NAMES = tuple(t.name for t in TARGETS)


def release_key(version: str) -> tuple[int, ...]:
    """A release's sort key (0.5.10.post1 after 0.5.10, 0.5.9 before both)."""
    parts = version.replace(".post", ".").split(".")
    return tuple(int(p) if p.isdigit() else 0 for p in parts)


def stamped_releases(root: Path, package: str) -> list[str]:
    """The releases of ``package`` whose venv was built under ``root`` (each venv's
    ``.installed`` stamp names it as ``package==V``), oldest first."""
    prefix = f"{package}=="
    found = {
        word.removeprefix(prefix)
        for stamp in root.glob(f".{package}-venv*/.installed")
        for word in stamp.read_text().split()
        if word.startswith(prefix)
    }
    return sorted(found, key=release_key)


class UnknownTarget(ValueError):
    """A target name not in the registry; the message lists the known ones."""


def target(name: str) -> Target:
    """The registry entry called ``name``."""
    for entry in TARGETS:
        if entry.name == name:
            return entry
    raise UnknownTarget(f"target {name!r}: choose one of {', '.join(('kvspec', *NAMES))}")
