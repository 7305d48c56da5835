"""The numbers of a `kvspec bench sim` result: each cell's medians over its runs, the checked
modes' ratios to the checker off, the issue's targets judged on them, and the printed table.

Keeps: every figure is derived from the recorded runs alone (a pure function of the cells),
and a ratio is paired within a round where the runs allow it, so a slower spell of the
shared machine cancels out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from rich.table import Table

from invariants.bench.timing import RunSample


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
        "full_le_1.5x_off_at_64k": {
            "met": all(r["full_over_off"] <= 1.5 for r in at64k) if at64k else None,
            "full_over_off": {str(r["batch"]): round(r["full_over_off"], 2) for r in at64k},
        },
        "census_at_most_linear_in_pool": census_growth(cells),
    }


def over_bound(result: dict[str, Any], bound: float) -> list[str]:
    """The guard (``--check``): each (batch, pool) whose full ÷ off ratio, paired within
    rounds of this one run, exceeds ``bound`` — or was not measured."""
    out = []
    for row in result["ratios"]:
        ratio, where = row["full_over_off"], f"batch {row['batch']} pool {row['pool_tokens']}"
        if ratio is None:
            out.append(f"{where}: full ÷ off not measured (a mode failed or was not run)")
        elif ratio > bound:
            out.append(f"{where}: full ÷ off = {ratio:.2f} > {bound}")
    return out


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
        table.add_row(*_row(c, ratio))
    return table


def _row(c: dict[str, Any], ratio: dict[tuple[int, int], dict[str, Any]]) -> tuple[str, ...]:
    """One cell's row of the table (an error cell: where it ran, and that it failed)."""
    where = (str(c["batch"]), str(c["pool_tokens"]), c["mode"])
    if c.get("error"):
        return (*where, "[red]error[/red]", "", "", "", "")
    over = ratio[(c["batch"], c["pool_tokens"])].get(f"{c['mode']}_over_off")
    census = c["census_us_per_step"]
    return (
        *where,
        f"{c['steps_per_s']:.0f}",
        f"{c['us_per_step']:.1f}",
        f"{c['checker_us_per_step']:.1f}",
        "–" if census is None else f"{census:.1f}",
        "1.00" if c["mode"] == "off" else ("–" if over is None else f"{over:.2f}"),
    )
