"""`kvspec bench sim`: scheduler steps per second of the sim-model engine, checker off / sums /
full.

Keeps: only ``Engine.step()`` is timed (``perf_counter_ns`` around each call), after warm-up,
with the waiting queue topped up between steps, outside the timed region; every mode and pool
of one batch size runs the same seeded requests (the shape depends on the batch and the
smallest pool only), so the modes and pools of a batch size compare like for like.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from importlib import import_module
from itertools import pairwise
from typing import Any

from rich.table import Table

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.model.tokenizer import NUM_BYTES
from engine.request import SamplingParams
from invariants.bench.machine import machine_info
from invariants.checking.checker import Checker, InvariantViolation, Level, ViewSource
from invariants.checking.loader import load_catalog
from invariants.checking.rule import Rule
from invariants.scenarios.workload import TraceRequest, TraceShape, make_trace

MODES: tuple[str, ...] = ("off", "sums", "full")
SUMS_EXCLUDED: tuple[str, ...] = ("census.", "kv.integrity")  # id prefixes left out of `sums`
DEFAULT_BATCHES: tuple[int, ...] = (8, 32, 128)
DEFAULT_POOLS: tuple[int, ...] = (4096, 65536, 1048576)
FILL = 0.75  # a full batch of the longest requests takes this share of the smallest pool
# the view builder's census calls: the incremental census of an engine's full pool, and the
# from-scratch one (hybrid SWA pools; the incremental one's fallback is not counted twice)
CENSUS_SITES: tuple[tuple[str, str], ...] = (
    ("engine.snapshot", "take_census"),
    ("engine.snapshot", "incremental_census"),
)
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """How each cell is run: timed steps and warm-up steps per run, runs per cell."""

    seed: int = 0
    steps: int = 300
    warmup: int = 50
    runs: int = 3
    page_size: int = 1


def bench_shape(batch: int, shape_pool: int) -> TraceShape:
    """Requests of at most ``T = FILL * shape_pool / batch`` tokens: 8 shared system prompts
    of T/4, a suffix of U[T/8, T/4], U[T/4, T/2] generated tokens — a full batch fits."""
    t = max(8, int(FILL * shape_pool / batch))
    return TraceShape(
        vocab=NUM_BYTES,
        num_system_prompts=8,
        system_prompt_len=t // 4,
        suffix_min=max(1, t // 8),
        suffix_max=max(1, t // 4),
        gen_min=max(1, t // 4),
        gen_max=max(1, t // 2),
    )


def trace_size(batch: int, shape: TraceShape, settings: BenchSettings) -> int:
    """Enough requests that the queue never runs dry: each finishes after >= gen_min steps."""
    steps = settings.warmup + settings.steps
    return 3 * batch + math.ceil(steps * batch / shape.gen_min)


def select_rules(rules: Sequence[Rule], mode: str) -> tuple[Rule, ...]:
    """The rules a mode checks: none (off), the sum/counter rules (sums), all (full)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: must be one of {', '.join(MODES)}")
    if mode == "off":
        return ()
    if mode == "sums":
        return tuple(r for r in rules if not r.id.startswith(SUMS_EXCLUDED))
    return tuple(rules)


@dataclass(slots=True, eq=False)
class TimedHook:
    """The checker hook (``CheckerHook``), timing the view build and the rule evaluation apart."""

    checker: Checker
    views: int = 0
    view_ns: int = 0
    rules_ns: int = 0

    def on_event(self, event: str, engine: ViewSource) -> None:
        if self.checker.wants(event):
            start = time.perf_counter_ns()
            view = engine.state_view(event, self.checker.view_parts(event))
            built = time.perf_counter_ns()
            self.checker.check(event, view)
            self.views += 1
            self.view_ns += built - start
            self.rules_ns += time.perf_counter_ns() - built


@dataclass(slots=True, eq=False)
class CensusTimer:
    """Time spent in the census inside the view builder (``calls == 0``: not found)."""

    ns: int = 0
    calls: int = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns += time.perf_counter_ns() - start
                self.calls += 1

        return timed


@contextmanager
def census_timer() -> Iterator[CensusTimer]:
    """Measurement only: wraps the view builder's census call while the block runs."""
    timer, saved = CensusTimer(), []
    for module_name, attr in CENSUS_SITES:
        module = import_module(module_name)
        if hasattr(module, attr):
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, timer.wrap(getattr(module, attr)))
    try:
        yield timer
    finally:
        for module, attr, original in saved:
            setattr(module, attr, original)


@dataclass(slots=True, eq=False)
class Feeder:
    """Submits trace requests so that ``target`` requests wait before every step."""

    engine: Engine
    trace: Iterator[TraceRequest]
    target: int
    starved: bool = False

    def top_up(self) -> None:
        while len(self.engine.scheduler.waiting_queue) < self.target:
            req = next(self.trace, None)
            if req is None:
                self.starved = True
                return
            params = SamplingParams(max_new_tokens=req.max_new_tokens, ignore_eos=True)
            self.engine.submit(list(req.input_ids), params, rid=req.rid)


@dataclass(slots=True)
class RunSample:
    """One run of one cell: totals over the timed steps."""

    steps: int = 0
    step_ns: int = 0
    views: int = 0
    view_ns: int = 0
    rules_ns: int = 0
    census_ns: int = 0
    census_calls: int = 0
    running_sum: int = 0
    launched_sum: int = 0
    decode_steps: int = 0
    tree_nodes: int = 0
    starved: bool = False
    integrity_failures: int = 0
    samples_ns: list[int] = field(default_factory=list)


def make_engine(batch: int, pool: int, shape: TraceShape, settings: BenchSettings) -> Engine:
    """The sim-model engine of one cell (SGLang defaults: overlap on, radix cache)."""
    memory = MemoryConfig(
        page_size=settings.page_size,
        max_total_tokens=pool,
        max_num_reqs=2 * batch,
        context_len=shape.max_context + 8,
    )
    return Engine(EngineConfig(memory=memory, seed=settings.seed, max_running_requests=batch))


def run_once(
    batch: int,
    pool: int,
    rules: tuple[Rule, ...],
    trace: list[TraceRequest],
    settings: BenchSettings,
    shape: TraceShape,
) -> RunSample:
    """A fresh engine: warm-up steps, then ``settings.steps`` timed steps."""
    engine = make_engine(batch, pool, shape, settings)
    hook = TimedHook(Checker(rules, Level.STRICT)) if rules else None
    if hook is not None:
        engine.attach(hook)
    feeder = Feeder(engine, iter(trace), batch)
    for _ in range(settings.warmup):
        feeder.top_up()
        engine.step()
    sample = RunSample()
    base_views, base_view, base_rules = (
        (hook.views, hook.view_ns, hook.rules_ns) if hook else (0, 0, 0)
    )
    gc.collect()
    with census_timer() as census:
        _timed_steps(engine, feeder, settings.steps, sample)
    sample.views = hook.views - base_views if hook else 0
    sample.view_ns = hook.view_ns - base_view if hook else 0
    sample.rules_ns = hook.rules_ns - base_rules if hook else 0
    sample.census_ns, sample.census_calls = census.ns, census.calls
    sample.starved = feeder.starved
    sample.tree_nodes = len(engine.state_view().tree.nodes)
    sample.integrity_failures = int(getattr(engine.runner, "num_integrity_failures", 0))
    return sample


def _timed_steps(engine: Engine, feeder: Feeder, steps: int, sample: RunSample) -> None:
    sched, clock = engine.scheduler, time.perf_counter_ns
    for _ in range(steps):
        feeder.top_up()
        start = clock()
        engine.step()
        elapsed = clock() - start
        sample.samples_ns.append(elapsed)
        sample.step_ns += elapsed
        sample.steps += 1
        batch = sched.cur_batch
        sample.running_sum += sched.running_batch.batch_size()
        sample.launched_sum += 0 if batch is None else batch.batch_size()
        sample.decode_steps += batch is not None and not batch.is_extend


def summarize_cell(batch: int, pool: int, mode: str, samples: list[RunSample]) -> dict[str, Any]:
    """The JSON record of one cell: medians over runs (spreads as min/max)."""
    rates = [s.steps * 1e9 / s.step_ns for s in samples]
    per_step = [s.step_ns / s.steps / 1e3 for s in samples]
    steps = sum(s.steps for s in samples)

    def median_us(attr: str) -> float:
        return statistics.median(getattr(s, attr) / s.steps / 1e3 for s in samples)

    census = (
        median_us("census_ns") if mode != "off" and all(s.census_calls for s in samples) else None
    )
    every = sorted(ns for s in samples for ns in s.samples_ns)
    return {
        "batch": batch,
        "pool_tokens": pool,
        "mode": mode,
        "runs": len(samples),
        "timed_steps": samples[0].steps,
        "steps_per_s": statistics.median(rates),
        "steps_per_s_min": min(rates),
        "steps_per_s_max": max(rates),
        "us_per_step": statistics.median(per_step),
        "us_per_step_runs": per_step,
        "p99_us_per_step": every[min(len(every) - 1, int(0.99 * len(every)))] / 1e3,
        "checker_us_per_step": statistics.median(
            (s.view_ns + s.rules_ns) / s.steps / 1e3 for s in samples
        ),
        "views_per_step": sum(s.views for s in samples) / steps,
        "view_us_per_step": median_us("view_ns"),
        "census_us_per_step": census,
        "rules_us_per_step": median_us("rules_ns"),
        "mean_running": sum(s.running_sum for s in samples) / steps,
        "mean_launched": sum(s.launched_sum for s in samples) / steps,
        "decode_share": sum(s.decode_steps for s in samples) / steps,
        "tree_nodes_at_end": statistics.median(s.tree_nodes for s in samples),
        "starved": any(s.starved for s in samples),
        "integrity_failures": sum(s.integrity_failures for s in samples),
        "error": None,
    }


def run_cells(
    batch: int,
    pool: int,
    rules: dict[str, tuple[Rule, ...]],
    trace: list[TraceRequest],
    settings: BenchSettings,
    shape: TraceShape,
) -> list[dict[str, Any]]:
    """Every mode's (batch, pool) cell: an untimed run (a first run is slower), then
    ``settings.runs`` rounds of one run per mode, the order rotated each round — a drift in
    the shared machine's speed touches every mode alike; a violation makes that mode's cell
    an error cell."""
    with suppress(InvariantViolation):  # (the timed runs report it)
        run_once(
            batch,
            pool,
            max(rules.values(), key=len),
            trace,
            replace(settings, steps=settings.warmup),
            shape,
        )
    samples: dict[str, list[RunSample]] = {mode: [] for mode in rules}
    errors: dict[str, str] = {}
    modes = list(rules)
    for round_ in range(settings.runs):
        for mode in modes[round_ % len(modes) :] + modes[: round_ % len(modes)]:
            if mode in errors:
                continue
            try:
                samples[mode].append(run_once(batch, pool, rules[mode], trace, settings, shape))
            except InvariantViolation as exc:
                errors[mode] = f"InvariantViolation: {exc}"
    return [
        {"batch": batch, "pool_tokens": pool, "mode": mode, "error": errors[mode]}
        if mode in errors
        else summarize_cell(batch, pool, mode, samples[mode])
        for mode in rules
    ]


def bench_sim(
    batch_sizes: Sequence[int] = DEFAULT_BATCHES,
    pool_tokens: Sequence[int] = DEFAULT_POOLS,
    modes: Sequence[str] = MODES,
    seed: int = 0,
    steps: int = 300,
    warmup: int = 50,
    runs: int = 3,
    page_size: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Steps/s of the sim-model engine for every (batch, pool, mode); see docs/benchmarks.md."""
    settings = BenchSettings(seed, steps, warmup, runs, page_size)
    catalog = load_catalog()
    rules = {mode: select_rules(catalog.rules, mode) for mode in modes}
    shape_pool = min(pool_tokens)
    cells, workloads = [], {}
    for batch in batch_sizes:
        shape = bench_shape(batch, shape_pool)
        trace = make_trace(seed, trace_size(batch, shape, settings), shape)
        workloads[str(batch)] = {**asdict(shape), "requests": len(trace)}
        for pool in pool_tokens:
            for cell in run_cells(batch, pool, rules, trace, settings, shape):
                cells.append(cell)
                if progress is not None:
                    progress(_progress_line(cell))
    result = {
        "benchmark": "sim",
        "machine": machine_info(),
        "settings": {
            **asdict(settings),
            "shape_pool": shape_pool,
            "modes": list(modes),
            "sums_excluded_prefixes": list(SUMS_EXCLUDED),
            "rules": {m: len(r) for m, r in rules.items()},
        },
        "workloads": workloads,
        "cells": cells,
    }
    result["ratios"] = ratios(cells)
    result["targets"] = targets(result)
    return result


def _progress_line(cell: dict[str, Any]) -> str:
    head = f"batch {cell['batch']:>4} pool {cell['pool_tokens']:>8} {cell['mode']:<4}"
    if cell.get("error"):
        return f"{head}  {cell['error']}"
    return f"{head}  {cell['steps_per_s']:8.0f} steps/s  {cell['us_per_step']:8.1f} µs/step"


def _cell(
    cells: Sequence[dict[str, Any]], batch: int, pool: int, mode: str
) -> dict[str, Any] | None:
    found = [c for c in cells if (c["batch"], c["pool_tokens"], c["mode"]) == (batch, pool, mode)]
    return found[0] if found and not found[0].get("error") else None


def ratios(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """µs/step of each checked mode ÷ µs/step with the checker off, per (batch, pool): the
    median over rounds of the ratio within a round (the modes of a round run back to back,
    so a slower spell of the shared machine cancels out); of the medians without rounds."""
    out = []
    for batch, pool in dict.fromkeys((c["batch"], c["pool_tokens"]) for c in cells):
        off = _cell(cells, batch, pool, "off")
        row: dict[str, Any] = {"batch": batch, "pool_tokens": pool}
        for mode in ("sums", "full"):
            cell = _cell(cells, batch, pool, mode)
            row[f"{mode}_over_off"] = _paired_ratio(cell, off) if cell and off else None
        out.append(row)
    return out


def _paired_ratio(cell: dict[str, Any], off: dict[str, Any]) -> float:
    pairs = list(zip(cell.get("us_per_step_runs", ()), off.get("us_per_step_runs", ())))
    if pairs and len(pairs) == len(cell["us_per_step_runs"]) == len(off["us_per_step_runs"]):
        return statistics.median(mode / base for mode, base in pairs)
    return float(cell["us_per_step"] / off["us_per_step"])


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's three targets, each with the numbers it was judged on (None: not measured)."""
    cells = result["cells"]
    b32 = [c for c in cells if c["batch"] == 32 and c["mode"] == "off" and not c.get("error")]
    at64k = [
        r for r in result["ratios"] if r["pool_tokens"] == 65536 and r["full_over_off"] is not None
    ]
    return {
        "off_batch32_ge_1000_steps_per_s": {
            "met": all(c["steps_per_s"] >= 1000 for c in b32) if b32 else None,
            "steps_per_s": {str(c["pool_tokens"]): round(c["steps_per_s"]) for c in b32},
        },
        "full_le_2x_off_at_64k": {
            "met": all(r["full_over_off"] <= 2.0 for r in at64k) if at64k else None,
            "full_over_off": {str(r["batch"]): round(r["full_over_off"], 2) for r in at64k},
        },
        "census_at_most_linear_in_pool": census_growth(cells),
    }


def census_growth(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Growth exponent of census µs/step between successive pools (<= 1: at most linear)."""
    exponents: dict[str, list[float]] = {}
    for batch in dict.fromkeys(c["batch"] for c in cells):
        points = sorted(
            (c["pool_tokens"], c["census_us_per_step"])
            for c in cells
            if c["batch"] == batch
            and c["mode"] == "full"
            and not c.get("error")
            and c.get("census_us_per_step")
        )
        exponents[str(batch)] = [
            round(math.log(c2 / c1) / math.log(p2 / p1), 3)
            for (p1, c1), (p2, c2) in pairwise(points)
        ]
    measured = [e for es in exponents.values() for e in es]
    return {"met": all(e <= 1.0 for e in measured) if measured else None, "exponents": exponents}


def summary_table(result: dict[str, Any]) -> Table:
    """The short table of a result: one row per cell."""
    table = Table(title=f"kvspec bench sim — {result['machine']['cpu_model']}")
    for column in (
        "batch",
        "pool",
        "mode",
        "steps/s",
        "µs/step",
        "checker µs",
        "census µs",
        "× off",
    ):
        table.add_column(column, justify="left" if column == "mode" else "right")
    ratio = {(r["batch"], r["pool_tokens"]): r for r in result["ratios"]}
    for c in result["cells"]:
        if c.get("error"):
            table.add_row(
                str(c["batch"]),
                str(c["pool_tokens"]),
                c["mode"],
                "[red]error[/red]",
                "",
                "",
                "",
                "",
            )
            continue
        over = ratio[(c["batch"], c["pool_tokens"])].get(f"{c['mode']}_over_off")
        census = c["census_us_per_step"]
        table.add_row(
            str(c["batch"]),
            str(c["pool_tokens"]),
            c["mode"],
            f"{c['steps_per_s']:.0f}",
            f"{c['us_per_step']:.1f}",
            f"{c['checker_us_per_step']:.1f}",
            "–" if census is None else f"{census:.1f}",
            "1.00" if c["mode"] == "off" else ("–" if over is None else f"{over:.2f}"),
        )
    return table
