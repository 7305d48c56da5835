"""`kvspec bench anchor`: the anchor workload replayed through kvspec's memory path, optionally
side by side with a real engine's own memory path on the same machine in the same session
(`--target sglang`: SGLang 0.5.23's, its driver targets/sglang/driver/anchor.py under the
`make sglang-env` interpreter). The workload: 8 shared system prompts of 256 tokens, suffixes of
32–512 and outputs of 16–64 tokens (seeded), a pool of the prompts plus 640 tokens per batch
slot, FCFS admission under a 16,384-token prefill budget and a memory gate; one step = the
admissions' extend, one decode round, the releases.

Keeps: the same trace (seed), pool, admission gate, step definition and timed window as
the anchor, so the ratio compares like with like; step counts, prefix hits and evicted
tokens are reported for both so a mismatch in the workload is visible, not hidden.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from engine.config import MemoryConfig
from engine.mem import paging
from engine.memory import KVMemory
from engine.observe.memory_view import memory_view
from invariants.checking.checker import Checker, Level
from invariants.checking.loader import load_catalog
from invariants.scenarios.memory_exercise import MemoryExercise
from invariants.scenarios.workload import TraceShape, make_trace

SHAPE = TraceShape()  # the anchor's: 8 × 256-token prompts, suffix U[32, 512], G U[16, 64]
MAX_PREFILL_TOKENS = 16384
PER_REQ_POOL_TOKENS = 640
CHECKS = {
    "conservation": ("pool.busy_sum",),
    "census": (
        "census.no_duplicates",
        "census.no_orphans",
        "census.no_dangling",
        "census.free_list_unique",
    ),
}


def anchor_memory(page_size: int, batch: int) -> MemoryConfig:
    pool = paging.ceil_align(
        SHAPE.num_system_prompts * SHAPE.system_prompt_len + PER_REQ_POOL_TOKENS * batch, 16
    )
    return MemoryConfig(
        page_size=page_size,
        max_total_tokens=pool,
        max_num_reqs=batch + 1,
        context_len=SHAPE.max_context,
    )


def run_once(page_size: int, batch: int, seed: int, check: str | None = None) -> dict[str, Any]:
    """One run; steps are timed only while requests wait (the anchor's window)."""
    mem = KVMemory.from_config(anchor_memory(page_size, batch))
    trace = make_trace(seed, max(384, 10 * batch), SHAPE)
    exercise = MemoryExercise(mem, trace, batch, seed=seed, max_prefill_tokens=MAX_PREFILL_TOKENS)
    checker = (
        None
        if check is None
        else Checker([r for r in load_catalog() if r.id in CHECKS[check]], Level.STRICT)
    )
    step_ns = check_ns = timed = 0
    while not exercise.done:
        in_window = exercise.has_waiting
        start = time.perf_counter_ns()
        exercise.step()
        stepped = time.perf_counter_ns()
        if checker is not None:
            view = memory_view(
                mem,
                "step",
                exercise.stats.steps,
                exercise.running,
                parts=checker.view_parts("step"),
            )
            checker.check("step", view)
        if in_window:
            timed += 1
            step_ns += stepped - start
            check_ns += time.perf_counter_ns() - stepped
    stats = exercise.stats
    return {
        "steps_total": stats.steps,
        "steps_timed": timed,
        "steps_per_s": timed / (step_ns / 1e9),
        "check_us_per_step": check_ns / 1e3 / timed,
        "hit_tokens": stats.prefix_hit_tokens,
        "extend_tokens": stats.extend_tokens,
        "evicted_tokens": mem.evicted_tokens,
    }


def bench_kvspec(
    page_sizes: list[int], batches: list[int], runs: int, warmup: int, seed: int
) -> list[dict[str, Any]]:
    """Median of ``runs`` (after ``warmup``) per cell, checks off; then each check's cost."""
    rows = []
    for ps in page_sizes:
        for batch in batches:
            speed = [run_once(ps, batch, seed) for _ in range(warmup + runs)][warmup:]
            row = {
                "page_size": ps,
                "batch": batch,
                **{
                    k: speed[0][k]
                    for k in (
                        "steps_total",
                        "steps_timed",
                        "hit_tokens",
                        "extend_tokens",
                        "evicted_tokens",
                    )
                },
            }
            row["steps_per_s"] = statistics.median(r["steps_per_s"] for r in speed)
            for check in CHECKS:
                timed = [run_once(ps, batch, seed, check) for _ in range(runs)]
                row[f"{check}_check_us_per_step"] = statistics.median(
                    r["check_us_per_step"] for r in timed
                )
            rows.append(row)
    return rows


def compare(kvspec: list[dict[str, Any]], engine: dict[str, Any]) -> list[dict[str, Any]]:
    """Per cell: kvspec ÷ the engine's steps/s and check cost, with both workloads' counts."""
    theirs = {(r["page_size"], r["batch"]): r for r in engine["results"]}
    rows = []
    for ours in kvspec:
        other = theirs.get((ours["page_size"], ours["batch"]))
        if other is None:
            continue
        rows.append(
            {
                "page_size": ours["page_size"],
                "batch": ours["batch"],
                "kvspec_steps_per_s": round(ours["steps_per_s"], 1),
                "target_steps_per_s": other["steps_per_s"]["median"],
                "speed_ratio": round(ours["steps_per_s"] / other["steps_per_s"]["median"], 2),
                "kvspec_conservation_us": round(ours["conservation_check_us_per_step"], 1),
                "target_conservation_us": other.get("conservation_check_us_per_step", {}).get(
                    "median"
                ),
                "kvspec_census_us": round(ours["census_check_us_per_step"], 1),
                "target_page_check_us": other.get("page_invariant_check_us_per_step", {}).get(
                    "median"
                ),
                "steps_timed": [ours["steps_timed"], other["steps_timed"]],
                "hit_tokens": [ours["hit_tokens"], other["hit_tokens"]],
                "evicted_tokens": [ours["evicted_tokens"], other["evicted_tokens"]],
            }
        )
    return rows
