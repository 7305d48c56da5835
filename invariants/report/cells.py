"""The report's cells and how one runs: every scenario spec, the configuration matrix and the
seeded memory-layer exercise, each checked at level 1 with a pool timeline attached.

Keeps: a cell's result is plain data (picklable, JSON-able) and a pure function of the cell,
so it can run in this process, in a worker process or on a Ray node and come back the same;
the replay command of every cell runs exactly that cell again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from invariants.checking.checker import Level
from invariants.checking.loader import shipped_catalog
from invariants.report.memory_cells import MemoryCell, default_memory_cells, run_memory_cell
from invariants.report.model import MAX_LISTED, CellResult
from invariants.report.timeline import Timeline
from invariants.scenarios.matrix import default_spec_paths, relative
from invariants.scenarios.matrix import report_cells as matrix_report_cells
from invariants.scenarios.runner import SpecOutcome, run_spec
from invariants.scenarios.spec import Spec, load_spec


@dataclass(frozen=True, slots=True)
class ReportCell:
    """One row of the report: a spec to run through the engine, or a memory-layer cell."""

    name: str
    replay: str
    spec: Spec | None = None
    memory: MemoryCell | None = None

    @property
    def kind(self) -> str:
        return "spec" if self.spec is not None else "memory"


def default_specs() -> list[tuple[str, Path]]:
    """Every scenario spec under specs/, by name."""
    return [(p.stem, p) for p in default_spec_paths()]


def spec_cells(full: bool = False, with_matrix: bool = True) -> list[ReportCell]:
    """Every spec × its matrix axes (all-pairs; ``full``: the product); without the matrix,
    each spec once as written."""
    if not with_matrix:
        return [
            ReportCell(name, f"kvspec run {relative(path)}", spec=load_spec(path))
            for name, path in default_specs()
        ]
    return [
        ReportCell(cell.name, cell.replay, spec=cell.spec) for cell in matrix_report_cells(full)
    ]


def memory_report_cells(cells: list[MemoryCell] | None = None) -> list[ReportCell]:
    chosen = default_memory_cells() if cells is None else cells
    return [ReportCell(f"memory {c.name} seed {c.seed}", c.replay, memory=c) for c in chosen]


def report_cells(full: bool = False) -> list[ReportCell]:
    """Every cell of `kvspec report`, in report order."""
    return spec_cells(full) + memory_report_cells()


def run_cell(cell: ReportCell, level: int = Level.RECORD) -> CellResult:
    """Run one cell checked at ``level`` with a timeline; top level, so workers can run it."""
    timeline = Timeline()
    if cell.spec is not None:
        return _spec_result(
            cell, run_spec(cell.spec, shipped_catalog(), level, observers=(timeline,)), timeline
        )
    assert cell.memory is not None
    result = run_memory_cell(cell.memory, shipped_catalog(), level, on_view=timeline.record)
    timeline.mark(result.violations)
    counters = {
        "finished": result.stats.finished,
        "cached": result.stats.prefix_hit_tokens,
        "evicted": result.evicted_tokens,
        "retracts": result.stats.retracted,
    }
    return CellResult(
        cell.name,
        "memory",
        cell.replay,
        result.stats.steps,
        result.checks,
        len(result.violations),
        _listed(result.violations),
        (),
        result.error,
        result.seconds,
        counters,
        timeline,
    )


def _spec_result(cell: ReportCell, out: SpecOutcome, timeline: Timeline) -> CellResult:
    timeline.mark(out.violations)
    s = out.stats
    counters = {
        "finished": s.finished_reqs,
        "cached": s.cached_tokens,
        "evicted": s.evicted_tokens,
        "retracts": s.retracted_reqs,
        "chunks": s.chunked_prefills,
        "mixed": s.mixed_batches,
        "forwards": s.forward_ct,
    }
    return CellResult(
        cell.name,
        "spec",
        cell.replay,
        s.iterations,
        out.checks,
        len(out.violations),
        _listed(out.violations),
        out.unmet,
        out.error,
        out.seconds,
        counters,
        timeline,
    )


def _listed(violations: Any) -> tuple[dict[str, Any], ...]:
    return tuple(asdict(v) for v in violations[:MAX_LISTED])
