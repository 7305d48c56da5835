"""`kvspec report`: lint the catalog, run the default specs and the matrix checked at
level 1, and the seeded memory-layer exercise; print one table each.

Keeps: the report never hides a failure — every violation and every unmet `expect` goal is
counted in its row, the first few are printed with the command that replays the row, and the
exit code is 1 if any row has one (DESIGN.md decision 3).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from invariants.checker import Level
from invariants.loader import Catalog, lint, load_catalog
from invariants.matrix import ROOT, matrix_cells
from invariants.memory_cells import (
    MemoryCell,
    MemoryCellResult,
    default_memory_cells,
    memory_table,
    run_memory_cell,
)
from invariants.runner import SpecOutcome, run_spec
from invariants.spec import load_spec

SPEC_DIR = ROOT / "specs"
COUNTERS = ("forward_ct", "finished_reqs", "cached_tokens", "evicted_tokens", "chunked_prefills",
            "retracted_reqs", "mixed_batches")


def default_specs() -> list[tuple[str, Path]]:
    """Every spec under specs/ except the matrix base (the matrix runs that)."""
    return [(p.stem, p) for p in sorted(SPEC_DIR.glob("*.yaml")) if p.stem != "matrix-base"]


def run_report(level: int = Level.RECORD, console: Console | None = None,
               with_matrix: bool = True, memory_cells: list[MemoryCell] | None = None) -> int:
    """Print the report; return the exit code (1 on any lint error, violation or unmet goal)."""
    console = console or Console(width=max(140, Console().width))
    errors = lint()
    for error in errors:
        console.print(f"lint: {error}", markup=False)
    catalog = load_catalog()
    spec_rows = [(name, f"kvspec run {path.relative_to(ROOT)}", run_spec(load_spec(path), catalog, level))
                 for name, path in default_specs()]
    if with_matrix:
        spec_rows += [(name, f"kvspec run specs/matrix-base.yaml {_sets(spec)}", run_spec(spec, catalog, level))
                      for name, spec in matrix_cells()]
    console.print(_spec_table(catalog, spec_rows))
    cells = default_memory_cells() if memory_cells is None else memory_cells
    mem_results = [run_memory_cell(cell, catalog, level) for cell in cells]
    console.print(memory_table(catalog, mem_results))
    failed = _print_failures(console, spec_rows) + _print_memory_failures(console, mem_results)
    return 1 if errors or failed else 0


def _sets(spec) -> str:
    e = spec.engine
    return (f"--set page_size={e.page_size} --set cache={e.cache} --set enable_overlap={e.enable_overlap} "
            f"--set enable_mixed_chunk={e.enable_mixed_chunk} --set test_retract={e.test_retract}"
            + (f" --set swa_tokens={e.swa_tokens} --set sliding_window={e.sliding_window}" if e.swa_tokens else "")
            + (" --set 'speculative={%s}'" % ", ".join(f"{k}: {v}" for k, v in e.speculative.items())
               if e.speculative else ""))


def _print_failures(console: Console, rows: list[tuple[str, str, SpecOutcome]]) -> int:
    failed = [(name, replay, out) for name, replay, out in rows if not out.ok]
    for name, replay, out in failed:
        console.print(f"[red]{name}[/red]: replay with `{replay}`")
        for violation in out.violations[:3]:
            console.print(f"  {violation}", markup=False)
        for goal in out.unmet:
            console.print(f"  expected {goal}", markup=False)
        if out.error:
            console.print(f"  engine error: {out.error}", markup=False)
    return len(failed)


def _print_memory_failures(console: Console, results: list[MemoryCellResult]) -> int:
    failed = [r for r in results if r.violations or r.error]
    for r in failed:
        console.print(f"[red]{r.cell.name} seed {r.cell.seed}[/red]: replay with `{r.cell.replay}`")
        for violation in r.violations[:3]:
            console.print(f"  {violation}", markup=False)
        if r.error:
            console.print(f"  engine error: {r.error}", markup=False)
    return len(failed)


def _spec_table(catalog: Catalog, rows: list[tuple[str, str, SpecOutcome]]) -> Table:
    table = Table(title=f"kvspec report — {len(catalog)} invariants checked at every scheduler event")
    for column in ("spec / matrix cell", "steps", "finished", "cached", "evicted", "chunks",
                   "retracts", "mixed", "checks", "violations", "goals", "time"):
        table.add_column(column, justify="left" if column.startswith("spec") else "right",
                         no_wrap=column.startswith("spec"))
    for name, _, out in rows:
        s = out.stats
        verdict = f"[red]{len(out.violations)}[/red]" if out.violations else "[green]0[/green]"
        goals = f"[red]{len(out.unmet)} unmet[/red]" if out.unmet else "[green]met[/green]"
        if out.error:
            goals = "[red]crashed[/red]"
        table.add_row(name, *(str(getattr(s, c)) for c in COUNTERS), str(out.checks), verdict, goals,
                      f"{out.seconds:.2f}s")
    return table
