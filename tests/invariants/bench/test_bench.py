"""`kvspec bench sim` at tiny sizes: the JSON carries the documented keys (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from invariants.bench.sim import MODES, bench_shape, bench_sim, select_rules
from invariants.bench.summary import over_bound
from invariants.checking.loader import load_catalog
from invariants.cli import app

CELL_KEYS = {
    "batch",
    "pool_tokens",
    "mode",
    "runs",
    "timed_steps",
    "steps_per_s",
    "steps_per_s_min",
    "steps_per_s_max",
    "us_per_step",
    "us_per_step_runs",
    "p99_us_per_step",
    "checker_us_per_step",
    "views_per_step",
    "view_us_per_step",
    "census_us_per_step",
    "rules_us_per_step",
    "mean_running",
    "mean_launched",
    "decode_share",
    "tree_nodes_at_end",
    "starved",
    "integrity_failures",
    "error",
}
TARGET_KEYS = {
    "off_batch32_ge_1000_steps_per_s",
    "full_le_1.5x_off_at_64k",
    "census_at_most_linear_in_pool",
}


def test_bench_sim_json_has_documented_keys() -> None:
    """Every (batch, pool, mode) cell is reported with the documented keys, plus machine,
    settings, workloads, ratios and targets; the checked modes build views, off builds none."""
    result = bench_sim([2], [256, 512], MODES, steps=4, warmup=2, runs=1)
    assert {"benchmark", "machine", "settings", "workloads", "cells", "ratios", "targets"} <= set(
        result
    )
    assert {"platform", "cpu_model", "cpu_count", "python", "torch", "numpy"} <= set(
        result["machine"]
    )
    assert len(result["cells"]) == 2 * len(MODES)
    for cell in result["cells"]:
        assert cell["error"] is None, cell["error"]
        assert set(cell) == CELL_KEYS
        assert (cell["views_per_step"] == 0) == (cell["mode"] == "off")
    assert {"batch", "pool_tokens", "sums_over_off", "full_over_off"} <= set(result["ratios"][0])
    assert set(result["targets"]) == TARGET_KEYS
    json.dumps(result)  # plain data only


def test_sums_mode_leaves_out_census_and_integrity() -> None:
    """`sums` checks every rule except census.* and kv.integrity; `full` checks the whole
    catalog."""
    rules = load_catalog().rules
    sums = {r.id for r in select_rules(rules, "sums")}
    assert not any(rid.startswith(("census.", "kv.integrity")) for rid in sums)
    assert {r.id for r in select_rules(rules, "full")} == {r.id for r in rules}
    assert select_rules(rules, "off") == ()


def test_bench_shape_fits_a_full_batch_in_the_pool() -> None:
    """A full batch of the longest requests fits the pool the shape was sized for."""
    for batch in (8, 32, 128):
        shape = bench_shape(batch, 4096)
        longest = shape.system_prompt_len + shape.suffix_max + shape.gen_max
        assert batch * longest <= 4096 and shape.gen_min >= 1


def test_cli_bench_sim_writes_json_file(tmp_path: Path) -> None:
    """`kvspec bench sim --out FILE` writes the JSON to FILE and exits 0."""
    out = tmp_path / "sim.json"
    args = [
        "bench",
        "sim",
        "--batch",
        "2",
        "--pool",
        "256",
        "--modes",
        "off,full",
        "--runs",
        "1",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [c["mode"] for c in data["cells"]] == ["off", "full"]


def test_the_guard_names_each_cell_over_its_bound() -> None:
    """`--check`: a cell whose paired full ÷ off ratio exceeds the bound is named with its
    ratio; one not measured is named too; one at or under it passes."""
    result = {
        "ratios": [
            {"batch": 8, "pool_tokens": 65536, "full_over_off": 1.4},
            {"batch": 32, "pool_tokens": 65536, "full_over_off": 2.9},
            {"batch": 128, "pool_tokens": 65536, "full_over_off": None},
        ]
    }
    assert over_bound(result, 1.4) == [
        "batch 32 pool 65536: full ÷ off = 2.90 > 1.4",
        "batch 128 pool 65536: full ÷ off not measured (a mode failed or was not run)",
    ]


def _sim_args(*extra: str) -> list[str]:
    tiny = ["--batch", "2", "--pool", "256", "--runs", "2", "--steps", "3", "--warmup", "1"]
    return ["bench", "sim", *tiny, *extra]


def test_cli_guard_fails_over_the_bound_and_passes_under_it(tmp_path: Path) -> None:
    """`kvspec bench sim --check` exits 1 when full ÷ off exceeds --max-ratio (a checked step
    always costs more than an unchecked one: 1.0 cannot hold) and 0 under a bound that must
    hold; the JSON records the bound and the cells over it."""
    out = tmp_path / "sim.json"
    failed = CliRunner().invoke(
        app, _sim_args("--modes", "off,full", "--check", "--max-ratio", "1.0", "--out", str(out))
    )
    assert failed.exit_code == 1, failed.output
    guard = json.loads(out.read_text())["guard"]
    assert guard["max_ratio"] == 1.0 and guard["over"][0].startswith("batch 2 pool 256: full")
    passed = CliRunner().invoke(
        app, _sim_args("--modes", "off,full", "--check", "--max-ratio", "1000", "--out", str(out))
    )
    assert passed.exit_code == 0, passed.output
    assert json.loads(out.read_text())["guard"]["over"] == []


def test_cli_guard_needs_both_modes() -> None:
    """`--check` without `off` and `full` among --modes is refused, naming the reason."""
    result = CliRunner().invoke(app, _sim_args("--modes", "full", "--check"))
    assert result.exit_code == 2
    assert "--check compares full with off" in result.output


def test_the_target_guard_pairs_each_round_and_names_specs_over_the_bound() -> None:
    """`kvspec bench target --check`: a spec's ratio is the median of each round's checked ÷
    unchecked (a slow spell of the machine touches both of a round), and a spec over the bound
    is named with it."""
    from invariants.bench.targets import _row
    from invariants.bench.targets import over_bound as target_over_bound

    slow_round = {False: [1.0, 2.0, 1.0], True: [2.0, 4.0, 2.2]}  # the second round ran slow
    row = _row("specs/matrix-base.yaml", 100, slow_round, "0.5.23")
    assert row["paired_ratio"] == 2.0 and row["checked_over_unchecked"] == 2.2
    result = {"rows": [row, {**row, "spec": "specs/radix-eviction.yaml", "paired_ratio": 1.5}]}
    assert target_over_bound(result, 1.9) == [
        "specs/matrix-base.yaml: checked ÷ unchecked = 2.00 > 1.9"
    ]
    assert target_over_bound(result, 2.0) == []
