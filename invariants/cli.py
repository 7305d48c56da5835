"""The `kvspec` command line: list and lint the invariant catalog, run the report, benchmark.

Keeps: command functions stay tiny — each parses its arguments and calls one library function;
lint output is one `path:line: [id] reason` line per problem (grep- and editor-friendly).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from invariants.loader import CatalogError, catalog_files, lint, load_catalog

app = typer.Typer(help="kvspec: spec-driven verification of KV-cache accounting.",
                  no_args_is_help=True, add_completion=False)
invariants_app = typer.Typer(help="The invariant catalog.", no_args_is_help=True)
app.add_typer(invariants_app, name="invariants")

Paths = Annotated[Optional[list[Path]],  # noqa: UP007 - typer reads Optional at runtime
                  typer.Argument(help="Catalog files or folders (default: the shipped catalog).")]


@invariants_app.command("list")
def list_invariants(paths: Paths = None) -> None:
    """Show every invariant: id, events, title, origin."""
    try:
        catalog = load_catalog(paths)
    except CatalogError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    table = Table("id", "events", "title", "origin", title=f"{len(catalog)} invariants")
    for rule in catalog:
        events = ", ".join(sorted(rule.events))
        table.add_row(rule.id, events, rule.title, ", ".join(rule.origin))
    Console().print(table)


@invariants_app.command("lint")
def lint_command(paths: Paths = None) -> None:
    """Load the catalog, validate every expression and run every fixture; exit 1 on any error."""
    errors = lint(paths)
    for line in errors:
        typer.echo(line)
    if errors:
        raise typer.Exit(1)
    files = catalog_files(paths)
    count = len(load_catalog(files))
    typer.echo(f"ok: {count} invariants in {len(files)} file(s), {2 * count} fixtures behave")


@app.command()
def report() -> None:
    """Run the default cells under the checker and print the invariant report."""
    from invariants.report import run_report

    raise typer.Exit(run_report())


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


@app.command("run")
def run_command(
    spec: Annotated[Path, typer.Argument(help="A scenario spec (specs/*.yaml).")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override an engine field: KEY=VALUE.")] = None,  # noqa: UP007
    strict: Annotated[bool, typer.Option(help="Stop at the first violation (level 2).")] = False,
) -> None:
    """Run one scenario spec with the checker after every event; exit 1 on a violation."""
    from invariants.runner import run_spec
    from invariants.spec import SpecError, load_spec, parse_overrides

    try:
        loaded = load_spec(spec, parse_overrides(set_ or []))
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    outcome = run_spec(loaded, load_catalog(), level=2 if strict else 1)
    typer.echo(f"{loaded.name}: {outcome.stats}")
    for violation in outcome.violations[:5]:
        typer.echo(str(violation))
    for goal in outcome.unmet:
        typer.echo(f"expected {goal}")
    raise typer.Exit(0 if outcome.ok else 1)


bench_app = typer.Typer(help="Benchmarks (results: docs/benchmarks.md).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{text!r}: expected positive integers")
    return values


@bench_app.command("sim")
def bench_sim_command(
    batch: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "8,32,128",
    pool: Annotated[str, typer.Option(help="KV pool sizes in tokens, comma-separated.")] = "4096,65536,1048576",
    modes: Annotated[str, typer.Option(help="Checker modes: off, sums, full.")] = "off,sums,full",
    runs: Annotated[int, typer.Option(min=1, help="Runs per cell (the median is reported).")] = 3,
    steps: Annotated[int, typer.Option(min=1, help="Timed steps per run.")] = 300,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed steps before them.")] = 50,
    seed: Annotated[int, typer.Option(help="The workload's seed.")] = 0,
    page_size: Annotated[int, typer.Option(min=1, help="Tokens per KV page.")] = 1,
    out: Annotated[Optional[Path],  # noqa: UP007 - typer reads Optional at runtime
                   typer.Option(help="Write the JSON here (default: stdout).")] = None,
) -> None:
    """Scheduler steps/s of the sim-model engine with the checker off, sums only, and full."""
    import json

    from invariants.bench import MODES, bench_sim, summary_table

    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = sorted(set(mode_list) - set(MODES))
    if unknown or not mode_list:
        raise typer.BadParameter(f"modes {unknown or modes!r}: choose from {', '.join(MODES)}")
    err = Console(stderr=True)
    result = bench_sim(_int_list(batch), _int_list(pool), mode_list, seed=seed, steps=steps,
                       warmup=warmup, runs=runs, page_size=page_size, progress=err.print)
    text = json.dumps(result, indent=2)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text + "\n", encoding="utf-8")
    err.print(summary_table(result))


@bench_app.command("kernels")
def bench_kernels_command(
    device: Annotated[str, typer.Option(help="A CUDA device (the kernels' benchmark needs a GPU).")] = "cuda",
    batch: Annotated[int, typer.Option(min=1, help="Requests per batch.")] = 64,
    prefix_len: Annotated[int, typer.Option(min=0, help="Cached tokens per request.")] = 3072,
    extend_len: Annotated[int, typer.Option(min=1, help="New tokens per request (decode context = prefix + extend).")] = 1024,
    peak_gbps: Annotated[Optional[float], typer.Option(help="The device's HBM peak, GB/s.")] = None,  # noqa: UP007
    peak_tflops: Annotated[Optional[float], typer.Option(help="The device's bf16 peak, TFLOP/s.")] = None,  # noqa: UP007
    out: Annotated[Optional[Path], typer.Option(help="Write the JSON here (default: stdout).")] = None,  # noqa: UP007
) -> None:
    """Each Triton kernel vs its torch twin vs SDPA: GB/s (decode, store), TFLOP/s (extend)."""
    import json

    from kernels.bench import DEFAULT_SHAPE, bench_kernels

    shape = DEFAULT_SHAPE._replace(batch=batch, prefix_len=prefix_len, extend_len=extend_len)
    try:
        result = bench_kernels(device, shape, peak_gbps=peak_gbps, peak_tflops=peak_tflops)
    except RuntimeError as exc:
        typer.echo(f"kvspec bench kernels: {exc}", err=True)
        raise typer.Exit(2) from None
    text = json.dumps(result, indent=2)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text + "\n", encoding="utf-8")


@bench_app.command("anchor")
def bench_anchor_command(
    page_sizes: Annotated[str, typer.Option(help="Page sizes, comma-separated.")] = "1,16",
    batches: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "8,32,128",
    runs: Annotated[int, typer.Option(min=1, help="Timed runs per cell (median).")] = 5,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed runs first.")] = 1,
    seed: Annotated[int, typer.Option(help="The trace's seed.")] = 0,
    sglang: Annotated[bool, typer.Option(help="Also run real SGLang's anchor script, side by side.")] = False,
    sglang_python: Annotated[Path, typer.Option(help="Python of `make sglang-env`.")] = Path(".sglang-venv/bin/python"),
    anchor_script: Annotated[Path, typer.Option(help="SGLang's anchor script.")] = Path("../shared/bench/anchor_sglang_bench.py"),
    out: Annotated[Optional[Path], typer.Option(help="Write the JSON here (default: stdout).")] = None,  # noqa: UP007
) -> None:
    """The anchor workload through kvspec's memory path (and real SGLang's, with --sglang)."""
    import json

    from invariants.anchor import bench_kvspec, bench_sglang, compare

    sizes, batch_list = _int_list(page_sizes), _int_list(batches)
    result: dict[str, object] = {"kvspec": bench_kvspec(sizes, batch_list, runs, warmup, seed)}
    if sglang:
        theirs = bench_sglang(sglang_python, anchor_script, sizes, batch_list, runs, warmup, seed)
        result |= {"sglang": theirs, "comparison": compare(result["kvspec"], theirs)}  # type: ignore[arg-type]
    text = json.dumps(result, indent=2)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    app()
