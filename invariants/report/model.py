"""The report's plain data: a cell's result, a real-engine row, the pair of them and the report's
header — what every writer (the printed tables, files.py, html.py, target_view.py) reads, and
nothing that runs a cell.

Keeps: records are plain data (picklable, JSON-able through ``to_dict``/``asdict``), so a
result comes back the same from a worker process or a Ray node; this module imports no writer,
so the writers import it and not each other.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field, fields
from importlib import metadata
from typing import Any

from invariants.checking.checker import Level
from invariants.report.text import first_violation
from invariants.report.timeline import Timeline

MAX_LISTED = 50  # violations kept per cell in the files (all are counted)
LISTED_IN_TEXT = 10  # violations written per failing cell in junit.xml and report.md


@dataclass(frozen=True, slots=True)
class CellResult:
    """What one cell did and found, as plain data."""

    name: str
    kind: str  # spec | memory
    replay: str
    steps: int
    checks: int
    num_violations: int
    violations: tuple[dict[str, Any], ...]  # the first MAX_LISTED, as Violation fields
    unmet: tuple[str, ...]
    error: str | None
    seconds: float
    counters: dict[str, int] = field(default_factory=dict)
    timeline: Timeline = field(default_factory=Timeline)

    @property
    def ok(self) -> bool:
        return not self.num_violations and not self.unmet and self.error is None

    @property
    def first_violation(self) -> str:
        return first_violation(self.violations)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "timeline"}
        return {
            **data,
            "ok": self.ok,
            "first_violation": self.first_violation,
            "violations": list(self.violations),
            "unmet": list(self.unmet),
            "timeline": self.timeline.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class TargetRow:
    """One spec, as written, on a real-engine target, as plain data."""

    name: str
    replay: str
    steps: int = 0
    checks: int = 0
    num_violations: int = 0
    violations: tuple[dict[str, Any], ...] = ()
    unmet: tuple[str, ...] = ()
    error: str | None = None  # a crash (driver refused an op, or died)
    unsupported: str | None = None  # why the adapter cannot run this spec
    seconds: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    version: str = ""
    target: str = ""  # the registry's name of the target
    checker: tuple[str, ...] = ()  # the engine's own checkers, "iteration N: msg"

    @property
    def ok(self) -> bool:
        """Violations, the engine's own checkers firing and crashes fail; unmet goals and
        unsupported specs do not."""
        return not self.num_violations and self.error is None and not self.checker

    @property
    def first_violation(self) -> str:
        return first_violation(self.violations)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {
            **data,
            "ok": self.ok,
            "violations": list(self.violations),
            "unmet": list(self.unmet),
            "notes": list(self.notes),
            "checker": list(self.checker),
        }


@dataclass(frozen=True, slots=True)
class SideBySide:
    """One spec on both targets (``kvspec`` None: no kvspec cell ran it as written)."""

    name: str
    kvspec: CellResult | None
    row: TargetRow


@dataclass(frozen=True, slots=True)
class ReportHeader:
    """What was checked, how, and where it ran."""

    title: str
    evaluation: str
    level: int
    num_invariants: int
    matrix: str  # pairwise | product
    backend: str
    version: str
    python: str

    @classmethod
    def for_run(
        cls, num_invariants: int, level: int, full: bool, workers: int, ray_address: str | None
    ) -> ReportHeader:
        how = (
            "record: each violation is recorded and the run goes on"
            if level == Level.RECORD
            else "strict: each cell stops at its first violation"
            if level == Level.STRICT
            else "off"
        )
        evaluation = (
            f"level {int(level)} ({how}); each invariant at every event it subscribes "
            "to — counter sums, exact ownership census, KV integrity"
        )
        backend = f"ray {ray_address}" if ray_address else f"local, {workers} worker(s)"
        try:
            version = metadata.version("kvspec")
        except metadata.PackageNotFoundError:
            version = "unknown"
        return cls(
            f"{num_invariants} invariants checked at every scheduler event",
            evaluation,
            int(level),
            num_invariants,
            "product" if full else "pairwise",
            backend,
            version,
            platform.python_version(),
        )


def summary(results: list[CellResult]) -> dict[str, Any]:
    """Totals over the cells; ``ok`` is the report's verdict (exit status 0)."""
    return {
        "cells": len(results),
        "failed": sum(not r.ok for r in results),
        "violations": sum(r.num_violations for r in results),
        "unmet_goals": sum(len(r.unmet) for r in results),
        "crashed": sum(r.error is not None for r in results),
        "checks": sum(r.checks for r in results),
        "ok": all(r.ok for r in results),
    }


def failing_first(results: list[CellResult]) -> list[CellResult]:
    """Failing cells first, each group in report order."""
    return [r for r in results if not r.ok] + [r for r in results if r.ok]
