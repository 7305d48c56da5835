"""`kvspec bench sim`: scheduler steps per second of the sim-model engine, checker off / sums /
full — every (batch, pool, mode) cell, each run as timing.py times it, summed up by summary.py.

Keeps: only ``Engine.step()`` is timed (``perf_counter_ns`` around each call), after warm-up,
with the waiting queue topped up between steps, outside the timed region; every mode and pool
of one batch size runs the same seeded requests (the shape depends on the batch and the
smallest pool only), so the modes and pools of a batch size compare like for like.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import asdict, replace
from typing import Any

from engine.model.tokenizer import NUM_BYTES
from invariants.bench.summary import ratios, summarize_cell, targets
from invariants.bench.timing import BenchSettings, RunSample, run_once
from invariants.checking.checker import InvariantViolation
from invariants.checking.loader import load_catalog
from invariants.checking.rule import Rule
from invariants.machine import machine_info
from invariants.scenarios.workload import TraceRequest, TraceShape, make_trace

MODES: tuple[str, ...] = ("off", "sums", "full")
SUMS_EXCLUDED: tuple[str, ...] = ("census.", "kv.integrity")  # id prefixes left out of `sums`
DEFAULT_BATCHES: tuple[int, ...] = (8, 32, 128)
DEFAULT_POOLS: tuple[int, ...] = (4096, 65536, 1048576)
FILL = 0.75  # a full batch of the longest requests takes this share of the smallest pool
Progress = Callable[[str], None]


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
    cells, workloads = _run_batches(batch_sizes, pool_tokens, rules, settings, progress)
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


def _run_batches(
    batch_sizes: Sequence[int],
    pool_tokens: Sequence[int],
    rules: dict[str, tuple[Rule, ...]],
    settings: BenchSettings,
    progress: Progress | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each batch size's seeded trace (shaped on the smallest pool), run in every pool: the
    cells in run order, and each batch size's workload."""
    shape_pool = min(pool_tokens)
    cells, workloads = [], {}
    for batch in batch_sizes:
        shape = bench_shape(batch, shape_pool)
        trace = make_trace(settings.seed, trace_size(batch, shape, settings), shape)
        workloads[str(batch)] = {**asdict(shape), "requests": len(trace)}
        for pool in pool_tokens:
            for cell in run_cells(batch, pool, rules, trace, settings, shape):
                cells.append(cell)
                if progress is not None:
                    progress(_progress_line(cell))
    return cells, workloads


def _progress_line(cell: dict[str, Any]) -> str:
    head = f"batch {cell['batch']:>4} pool {cell['pool_tokens']:>8} {cell['mode']:<4}"
    if cell.get("error"):
        return f"{head}  {cell['error']}"
    return f"{head}  {cell['steps_per_s']:8.0f} steps/s  {cell['us_per_step']:8.1f} µs/step"
