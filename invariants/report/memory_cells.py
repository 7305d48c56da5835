"""Memory-layer cells of the report: the seeded anchor-style exercise
(invariants/scenarios/memory_exercise.py) over page sizes, caches and SWA, checked after every step.

Keeps: a cell is a pure function of its fields, so `kvspec explore memory …` replays it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.table import Table

from engine.config import MemoryConfig
from engine.memory import KVMemory
from engine.observe.crosscheck import CrossCheckMismatch
from engine.observe.memory_view import memory_view
from engine.request import Req
from engine.view import StateView
from invariants.checking.checker import Checker, InvariantViolation, Level, Violation
from invariants.checking.loader import Catalog
from invariants.scenarios.memory_exercise import ExerciseStats, MemoryExercise
from invariants.scenarios.workload import TraceShape, make_trace

MEMORY_SHAPE = TraceShape().scaled(8)  # 32-token system prompts, suffix 4..64, 2..8 generated


@dataclass(frozen=True, slots=True)
class MemoryCell:
    """One checked memory-layer run: a configuration, a batch size, a seed."""

    page_size: int
    cache: str = "radix"
    swa: bool = False
    seed: int = 0
    batch: int = 8
    num_requests: int = 160
    retract_prob: float = 0.05

    @property
    def name(self) -> str:
        return f"ps{self.page_size}-{self.cache}{'-swa' if self.swa else ''}"

    @property
    def replay(self) -> str:
        swa = " --swa" if self.swa else ""
        return (
            f"kvspec explore memory --page-size {self.page_size} --cache {self.cache}{swa} "
            f"--seed {self.seed} --batch {self.batch} --requests {self.num_requests}"
        )

    def memory_config(self) -> MemoryConfig:
        pool = MEMORY_SHAPE.num_system_prompts * MEMORY_SHAPE.system_prompt_len + 160 * self.batch
        return MemoryConfig(
            page_size=self.page_size,
            max_total_tokens=pool,
            max_num_reqs=self.batch + 2,
            context_len=MEMORY_SHAPE.max_context,
            cache=self.cache,  # type: ignore[arg-type]
            swa_tokens=pool if self.swa else None,
            sliding_window=16 if self.swa else None,
        )


@dataclass(frozen=True, slots=True)
class MemoryCellResult:
    cell: MemoryCell
    stats: ExerciseStats
    evicted_tokens: int
    violations: tuple[Violation, ...]
    checks: int
    seconds: float
    error: str | None = None  # the exercise raised: reported with the violations before it


def default_memory_cells() -> list[MemoryCell]:
    """Page sizes 1/4/16 × radix/chunk, plus SWA hybrids, two seeds each."""
    cells = [
        MemoryCell(ps, cache, seed=seed)
        for ps in (1, 4, 16)
        for cache in ("radix", "chunk")
        for seed in (0, 1)
    ]
    return cells + [
        MemoryCell(ps, "radix", swa=True, seed=seed) for ps in (1, 4) for seed in (0, 1)
    ]


def run_memory_cell(
    cell: MemoryCell,
    catalog: Catalog,
    level: int = Level.RECORD,
    on_view: Callable[[StateView], None] | None = None,
) -> MemoryCellResult:
    """Run one cell with the checker after every step and at idle; ``on_view`` sees each view
    after the checker (the report's timeline)."""
    mem = KVMemory.from_config(cell.memory_config())
    checker = Checker(catalog, level=level)

    def observe(event: str, step: int, live: list[Req]) -> None:
        view = memory_view(mem, event, step, live)
        checker.check(event, view)
        if on_view is not None:
            on_view(view)

    trace = make_trace(cell.seed, cell.num_requests, MEMORY_SHAPE)
    start = time.perf_counter()
    exercise = MemoryExercise(
        mem, trace, cell.batch, seed=cell.seed, retract_prob=cell.retract_prob, observe=observe
    )
    error = None
    try:
        exercise.run()
    except (InvariantViolation, CrossCheckMismatch):
        raise  # level 2: the caller wants the first violation; a mismatch is the harness's
    except Exception as exc:  # a crash is a finding, reported with the violations before it
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    checks = sum(s.evaluations for s in checker.stats().values())
    return MemoryCellResult(
        cell, exercise.stats, mem.evicted_tokens, tuple(checker.violations), checks, seconds, error
    )


def memory_table(catalog: Catalog, results: list[MemoryCellResult]) -> Table:
    table = Table(
        title="memory layer (anchor-style exercise, no scheduler) — checked after every step"
    )
    for column in (
        "cell",
        "seed",
        "steps",
        "requests",
        "prefix hits",
        "evicted",
        "retracts",
        "checks",
        "violations",
        "time",
    ):
        table.add_column(column, justify="left" if column == "cell" else "right")
    for r in results:
        verdict = f"[red]{len(r.violations)}[/red]" if r.violations else "[green]0[/green]"
        table.add_row(
            r.cell.name,
            str(r.cell.seed),
            str(r.stats.steps),
            str(r.stats.finished),
            str(r.stats.prefix_hit_tokens),
            str(r.evicted_tokens),
            str(r.stats.retracted),
            str(r.checks),
            verdict,
            f"{r.seconds:.2f}s",
        )
    return table
