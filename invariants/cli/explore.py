"""`kvspec explore …`: seeded exploration runs."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from invariants.cli.app import app
from invariants.loader import load_catalog

explore_app = typer.Typer(help="Seeded exploration runs (replay a report cell).", no_args_is_help=True)
app.add_typer(explore_app, name="explore")


@explore_app.command("memory")
def explore_memory(
    page_size: Annotated[int, typer.Option(help="Tokens per KV page.")] = 1,
    cache: Annotated[str, typer.Option(help="Prefix cache: radix or chunk.")] = "radix",
    swa: Annotated[bool, typer.Option(help="Hybrid sliding-window pools.")] = False,
    seed: Annotated[int, typer.Option(help="The one seed of the run.")] = 0,
    batch: Annotated[int, typer.Option(help="Running requests at most.")] = 8,
    requests: Annotated[int, typer.Option(help="Requests in the trace.")] = 160,
    strict: Annotated[bool, typer.Option(help="Stop at the first violation (level 2).")] = False,
) -> None:
    """Run one memory-layer cell checked after every step; exit 1 on a violation."""
    from invariants.memory_cells import MemoryCell, memory_table, run_memory_cell

    catalog = load_catalog()
    result = run_memory_cell(MemoryCell(page_size, cache, swa, seed, batch, requests), catalog,
                             level=2 if strict else 1)
    Console().print(memory_table(catalog, [result]))
    for violation in result.violations[:5]:
        typer.echo(str(violation))
    raise typer.Exit(1 if result.violations else 0)
