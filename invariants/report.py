"""`kvspec report`: lint the catalog, run the default cells checked at level 1, print a table.

Keeps: the report never hides a failure — every violation is counted in its cell, the first
few are printed with the command that replays the cell, and the exit code is 1 if any cell
had one (DESIGN.md decision 3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from engine.config import MemoryConfig
from engine.memory import KVMemory
from engine.snapshot import memory_view
from invariants.checker import Checker, Level, Violation
from invariants.explore import ExerciseStats, MemoryExercise
from invariants.loader import Catalog, lint, load_catalog
from invariants.workload import TraceShape, make_trace

REPORT_SHAPE = TraceShape().scaled(8)  # 32-token system prompts, suffix 4..64, 2..8 generated


@dataclass(frozen=True, slots=True)
class Cell:
    """One checked run: a memory configuration, a batch size, a seed."""

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
        return (f"kvspec explore memory --page-size {self.page_size} --cache {self.cache}{swa} "
                f"--seed {self.seed} --batch {self.batch} --requests {self.num_requests}")

    def memory_config(self) -> MemoryConfig:
        pool = REPORT_SHAPE.num_system_prompts * REPORT_SHAPE.system_prompt_len + 160 * self.batch
        return MemoryConfig(
            page_size=self.page_size, max_total_tokens=pool, max_num_reqs=self.batch + 2,
            context_len=REPORT_SHAPE.max_context, cache=self.cache,  # type: ignore[arg-type]
            swa_tokens=pool if self.swa else None, sliding_window=16 if self.swa else None,
        )


@dataclass(frozen=True, slots=True)
class CellResult:
    cell: Cell
    stats: ExerciseStats
    evicted_tokens: int
    violations: tuple[Violation, ...]
    checks: int
    seconds: float


def default_cells() -> list[Cell]:
    """Page sizes 1/4/16 × radix/chunk, plus SWA hybrids, two seeds each."""
    cells = [Cell(ps, cache, seed=seed) for ps in (1, 4, 16) for cache in ("radix", "chunk") for seed in (0, 1)]
    cells += [Cell(ps, "radix", swa=True, seed=seed) for ps in (1, 4) for seed in (0, 1)]
    return cells


def run_cell(cell: Cell, catalog: Catalog, level: int = Level.RECORD) -> CellResult:
    """Run one cell with the checker after every step and at idle."""
    mem = KVMemory.from_config(cell.memory_config())
    checker = Checker(catalog, level=level)

    def observe(event: str, step: int, live: list) -> None:
        checker.check(event, memory_view(mem, event, step, live))

    trace = make_trace(cell.seed, cell.num_requests, REPORT_SHAPE)
    start = time.perf_counter()
    stats = MemoryExercise(mem, trace, cell.batch, seed=cell.seed, retract_prob=cell.retract_prob,
                           observe=observe).run()
    checks = sum(s.evaluations for s in checker.stats().values())
    seconds = time.perf_counter() - start
    return CellResult(cell, stats, mem.evicted_tokens, tuple(checker.violations), checks, seconds)


def run_report(cells: list[Cell] | None = None, level: int = Level.RECORD,
               console: Console | None = None) -> int:
    """Print the report; return the exit code (1 on any lint error or violation)."""
    console = console or Console(width=max(120, Console().width))
    errors = lint()
    for error in errors:
        console.print(f"[red]lint[/red] {error}")
    catalog = load_catalog()
    results = [run_cell(cell, catalog, level) for cell in cells or default_cells()]
    console.print(_table(catalog, results))
    failed = [r for r in results if r.violations]
    for result in failed:
        console.print(f"[red]{result.cell.name} seed {result.cell.seed}[/red]: replay with `{result.cell.replay}`")
        for violation in result.violations[:3]:
            console.print(f"  {violation}")
    return 1 if errors or failed else 0


def _table(catalog: Catalog, results: list[CellResult]) -> Table:
    table = Table(title=f"kvspec memory-layer report — {len(catalog)} invariants, checked after every step")
    for column in ("cell", "seed", "steps", "requests", "prefix hits", "evicted", "retracts", "checks", "violations", "time"):
        table.add_column(column, justify="left" if column == "cell" else "right")
    for r in results:
        verdict = f"[red]{len(r.violations)}[/red]" if r.violations else "[green]0[/green]"
        table.add_row(r.cell.name, str(r.cell.seed), str(r.stats.steps), str(r.stats.finished),
                      str(r.stats.prefix_hit_tokens), str(r.evicted_tokens), str(r.stats.retracted), str(r.checks),
                      verdict, f"{r.seconds:.2f}s")
    return table
