"""`kvspec bench sim|kernels|anchor|target|serve` (results: docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, cast

import typer
from rich.console import Console

from invariants.cli.app import (
    OutPath,
    TargetOption,
    TargetPython,
    TargetVersion,
    bench_app,
    chosen_target,
    emit_json,
    int_list,
    target_options,
)

CheckOption = Annotated[
    bool,
    typer.Option(
        "--check", help="Exit 1 when checked ÷ unchecked, paired in this run, exceeds --max-ratio."
    ),
]
MaxRatioOption = Annotated[float, typer.Option(min=1.0, help="The bound --check holds to.")]


@bench_app.command("sim")
def bench_sim_command(
    batch: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "8,32,128",
    pool: Annotated[
        str, typer.Option(help="KV pool sizes in tokens, comma-separated.")
    ] = "4096,65536,1048576",
    modes: Annotated[str, typer.Option(help="Checker modes: off, sums, full.")] = "off,sums,full",
    runs: Annotated[int, typer.Option(min=1, help="Runs per cell (the median is reported).")] = 3,
    steps: Annotated[int, typer.Option(min=1, help="Timed steps per run.")] = 300,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed steps before them.")] = 50,
    seed: Annotated[int, typer.Option(help="The workload's seed.")] = 0,
    page_size: Annotated[int, typer.Option(min=1, help="Tokens per KV page.")] = 1,
    check: CheckOption = False,
    max_ratio: MaxRatioOption = 2.5,
    out: OutPath = None,
) -> None:
    """Scheduler steps/s of the sim-model engine with the checker off, sums only, and full."""
    from invariants.bench.sim import MODES, bench_sim
    from invariants.bench.summary import over_bound, summary_table

    mode_list = _modes(modes, MODES, check)
    err = Console(stderr=True)
    sizes = dict(seed=seed, steps=steps, warmup=warmup, runs=runs, page_size=page_size)
    result = bench_sim(int_list(batch), int_list(pool), mode_list, **sizes, progress=err.print)
    if check:
        result["guard"] = {"max_ratio": max_ratio, "over": over_bound(result, max_ratio)}
    emit_json(result, out)
    err.print(summary_table(result))
    if check:
        _judge(err, result["guard"]["over"], f"full ÷ off ≤ {max_ratio}")


def _modes(text: str, known: tuple[str, ...], check: bool) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(known))
    if unknown or not modes:
        raise typer.BadParameter(f"modes {unknown or text!r}: choose from {', '.join(known)}")
    if check and not {"off", "full"} <= set(modes):
        raise typer.BadParameter("--check compares full with off: --modes must name both")
    return modes


def _judge(err: Console, over: list[str], bound: str, each: str = "cell") -> None:
    """The guard's verdict: exit 1, naming each cell over the bound."""
    for line in over:
        err.print(f"[red]over the bound[/red] {line}")
    if over:
        raise typer.Exit(1)
    err.print(f"[green]guard passed[/green]: {bound} in every {each}")


@bench_app.command("kernels")
def bench_kernels_command(
    device: Annotated[
        str, typer.Option(help="A CUDA device (the kernels' benchmark needs a GPU).")
    ] = "cuda",
    batch: Annotated[int, typer.Option(min=1, help="Requests per batch.")] = 64,
    prefix_len: Annotated[int, typer.Option(min=0, help="Cached tokens per request.")] = 3072,
    extend_len: Annotated[
        int, typer.Option(min=1, help="New tokens per request (decode context = prefix + extend).")
    ] = 1024,
    peak_gbps: Annotated[float | None, typer.Option(help="The device's HBM peak, GB/s.")] = None,
    peak_tflops: Annotated[
        float | None, typer.Option(help="The device's bf16 peak, TFLOP/s.")
    ] = None,
    out: OutPath = None,
) -> None:
    """Each Triton kernel vs its torch twin vs SDPA: GB/s (decode, store), TFLOP/s (extend)."""
    from kernels.bench import DEFAULT_SHAPE, bench_kernels

    shape = DEFAULT_SHAPE._replace(batch=batch, prefix_len=prefix_len, extend_len=extend_len)
    try:
        result = bench_kernels(device, shape, peak_gbps=peak_gbps, peak_tflops=peak_tflops)
    except RuntimeError as exc:
        typer.echo(f"kvspec bench kernels: {exc}", err=True)
        raise typer.Exit(2) from None
    emit_json(result, out)


@bench_app.command("anchor")
def bench_anchor_command(
    page_sizes: Annotated[str, typer.Option(help="Page sizes, comma-separated.")] = "1,16",
    batches: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "8,32,128",
    runs: Annotated[int, typer.Option(min=1, help="Timed runs per cell (median).")] = 5,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed runs first.")] = 1,
    seed: Annotated[int, typer.Option(help="The trace's seed.")] = 0,
    target: Annotated[
        str | None,
        typer.Option(
            "--target", help="Also a real engine's own memory path, side by side (sglang)."
        ),
    ] = None,
    target_python: TargetPython = None,
    out: OutPath = None,
) -> None:
    """The anchor workload through kvspec's memory path (and a real engine's, --target)."""
    from invariants.bench.anchor import bench_kvspec, compare
    from invariants.targets.registry import target as registered

    sizes, batch_list = int_list(page_sizes), int_list(batches)
    ours = bench_kvspec(sizes, batch_list, runs, warmup, seed)
    result: dict[str, object] = {"kvspec": ours}
    if target is not None:
        adapter = registered(chosen_target(target, ())).adapter()
        anchor = getattr(adapter, "anchor", None)  # the adapters that run the anchor have it
        if anchor is None:
            raise typer.BadParameter(f"--target {target}: that target runs no anchor workload")
        options = target_options(target_python, None)
        theirs = anchor(sizes, batch_list, runs, warmup, seed, options)
        result |= {target: theirs, "comparison": compare(ours, theirs)}
    emit_json(result, out)


@bench_app.command("target")
def bench_target_command(
    target: TargetOption = "vllm",
    specs: Annotated[
        list[Path] | None, typer.Argument(help="Specs the target can run (default: two).")
    ] = None,
    runs: Annotated[int, typer.Option(min=1, help="Timed runs per spec and mode (median).")] = 3,
    target_python: TargetPython = None,
    target_version: TargetVersion = None,
    check: CheckOption = False,
    max_ratio: MaxRatioOption = 2.5,
    replay: Annotated[
        bool,
        typer.Option(
            "--replay",
            help="Also the driver's own CPU time, views off and on, replaying one checked "
            "run's ops inside it (the vllm target).",
        ),
    ] = False,
    out: OutPath = None,
) -> None:
    """A real engine (--target): iterations/s unchecked (the driver only steps) vs checked
    (a view per step, the whole catalog) on each spec's trace, one driver, and the ratio
    (needs the target's venv)."""
    from invariants.bench.targets import DEFAULT_SPECS, bench_target, over_bound

    name = chosen_target(target, ())
    chosen = tuple(str(p) for p in specs) if specs else DEFAULT_SPECS
    options = target_options(target_python, target_version)
    try:
        result = bench_target(name, chosen, runs, options, replay)
    except ValueError as exc:  # a spec the target cannot run, a replay it cannot do
        typer.echo(f"kvspec bench target: {exc}", err=True)
        raise typer.Exit(2) from None
    if check:
        result["guard"] = {"max_ratio": max_ratio, "over": over_bound(result, max_ratio)}
    emit_json(result, out)
    if check:
        bound = f"checked ÷ unchecked ≤ {max_ratio}"
        _judge(Console(stderr=True), result["guard"]["over"], bound, "spec")


@bench_app.command("serve")
def bench_serve_command(
    sessions: Annotated[int, typer.Option(min=1, help="Concurrent sessions (clients).")] = 64,
    turns: Annotated[int, typer.Option(min=1, help="Turns per session.")] = 8,
    modes: Annotated[
        str, typer.Option(help="pinned (streaming sessions), radix, session-radix (tags).")
    ] = ("pinned,radix,session-radix"),
    max_total_tokens: Annotated[int, typer.Option(help="KV pool size in tokens.")] = 16384,
    page_size: Annotated[int, typer.Option(min=1, help="Tokens per KV page.")] = 1,
    strict_mem_check: Annotated[
        int, typer.Option(min=0, max=2, help="The server's checking level.")
    ] = 1,
    seed: Annotated[int, typer.Option(help="The clients' seed.")] = 0,
    out: OutPath = None,
) -> None:
    """Sessions × turns over HTTP on loopback (disconnects and aborts included): turns/s,
    p50/p99 turn latency, slots reclaimed, and the accounting afterwards, per mode."""
    from engine.server.args import ServerArgs
    from invariants.bench.serve import MODES, bench_serve
    from invariants.terminal import Col, out_console, print_table

    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    if not mode_list or set(mode_list) - set(MODES):
        raise typer.BadParameter(f"modes {modes!r}: choose from {', '.join(MODES)}")
    level = cast("Literal[0, 1, 2]", strict_mem_check)  # typer's min/max keep it in range
    args = ServerArgs(
        max_total_tokens=max_total_tokens, page_size=page_size, strict_mem_check=level
    )
    result = bench_serve(args, sessions, turns, mode_list, seed)
    emit_json(result, out)
    names = ("mode", "ok_turns", "wall_s", "turns_per_s", "p50_ms", "p99_ms", "slots_reclaimed",
             "violations", "balanced")  # fmt: skip
    cols = [Col(name, "id" if name == "mode" else "num") for name in names]
    rows = [[row[name] for name in names] for row in result["rows"]]
    title = f"kvspec bench serve — {result['machine']['cpu_model']}"
    print_table(out_console(stderr=True), cols, rows, title=title)
