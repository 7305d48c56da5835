"""The engine explorer (invariants/explore/): one seed gives one swarm configuration and one
trace, byte for byte; every configuration is a valid matrix row; traces run safety → drain
→ idle; the correct engine passes; worker processes change nothing but speed; the
`sometimes` goals are read from what really happened (features.py); failures are keyed by
what failed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from invariants.cli import app
from invariants.cli import explore as explore_cli
from invariants.explore import (
    DEFAULT_SEEDS,
    DEFAULT_STEPS,
    explore,
    failure_key,
    generate_trace,
    run_seed,
)
from invariants.explore.explorer import check_trace, default_catalog
from invariants.explore.features import REQUIRED, FeatureProbe, goals_of, outcome_features
from invariants.explore.swarm import SIM_SKIPS, TINY_SHARE, sample_swarm
from invariants.scenarios.matrix_axes import axis_values, load_matrix, violations
from invariants.scenarios.ops import (
    Abort,
    CloseSession,
    FlushCache,
    Idle,
    OpenSession,
    SessionRef,
    Step,
    Submit,
    Trace,
    WaitFor,
)
from invariants.scenarios.spec import EngineSpec
from invariants.scenarios.trace_run import run_trace

SEEDS = range(120)


def test_same_seed_same_trace_and_outcome(tmp_path: Path) -> None:
    """Generating a seed twice gives identical trace JSON; running it twice, the same result."""
    generate_trace(2, 120).save(tmp_path / "a.json")
    generate_trace(2, 120).save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    first, second = run_seed(2, 120), run_seed(2, 120)
    assert (first.failure, first.goals, first.steps, first.ops) == (
        second.failure,
        second.goals,
        second.steps,
        second.ops,
    )


def test_swarm_configurations_are_valid_matrix_rows() -> None:
    """Every seed's engine is a matrix row (listed values, no declared constraint broken,
    MLA only on the tiny model) that the engine accepts; seeds differ in configuration; about
    one in sixteen runs the tiny model, in float64."""
    axes = load_matrix().axes
    rows = []
    for seed in SEEDS:
        engine = sample_swarm(seed).engine
        row = axis_values(engine.model_dump())
        skips = SIM_SKIPS if engine.model == "sim" else {}
        assert all(row[a] in axes[a] and row[a] not in skips.get(a, ()) for a in axes), (
            seed,
            row,
        )
        assert engine.model == "sim" or engine.tiny["dtype"] == "float64"
        assert not violations(row), (seed, row)
        engine.engine_config(seed)  # raises ConfigError on an invalid configuration
        rows.append(tuple(row.values()))
    assert len(set(rows)) > len(SEEDS) // 2
    for axis, values in axes.items():  # every value of every axis is drawn by some seed
        drawn = {axis_values(sample_swarm(s).engine.model_dump())[axis] for s in SEEDS}
        assert drawn == set(values), axis
    tiny = sum(sample_swarm(s).engine.model == "tiny" for s in range(400))
    assert 400 * TINY_SHARE / 2 < tiny < 400 * TINY_SHARE * 2


def test_swarm_switches_whole_features_off() -> None:
    """Some seeds run no aborts, some no sessions, some no fault op at all; most run some."""
    weights = [sample_swarm(s).weights for s in SEEDS]
    assert any(w["abort"] == 0 for w in weights) and any(w["abort"] > 0 for w in weights)
    assert any(w["turn"] == 0 for w in weights) and any(w["turn"] > 0 for w in weights)
    faults = ("abort", "force_retract", "flush_cache", "advance_clock", "open_session")
    assert any(all(w[k] == 0 for k in faults) for w in weights)


def test_trace_phases() -> None:
    """Safety ops schedule at least ``steps`` iterations; then every session left open is
    closed, the engine must idle within a bounded budget, and the cache is flushed."""
    for seed in range(10):
        ops = generate_trace(seed, 150).ops
        assert (
            isinstance(ops[-1], FlushCache)
            and isinstance(ops[-2], Idle)
            and ops[-2].max_steps < 10**6
        )
        scheduled = sum(
            op.n if isinstance(op, Step) else op.max_steps if isinstance(op, WaitFor) else 0
            for op in ops
        )
        opened = {op.sid for op in ops if isinstance(op, OpenSession)}
        closed = {op.sid for op in ops if isinstance(op, CloseSession)}
        assert scheduled + sum(op.op == "force_retract" for op in ops) >= 150 and opened == closed


def test_correct_engine_passes_a_few_seeds() -> None:
    """The explorer finds nothing on the engine as shipped."""
    report = explore(seeds=4, steps=150)
    assert [r.seed for r in report.results] == [0, 1, 2, 3]
    assert report.failed == [], [(r.seed, r.failure, r.detail) for r in report.failed]


def test_workers_change_only_the_speed() -> None:
    """Two worker processes report the same results, in seed order, as one."""

    def key(report):
        return [(r.seed, r.label, r.failure, r.goals, r.steps) for r in report.results]

    assert key(explore(seeds=3, steps=80, seed_start=10, workers=2)) == key(
        explore(seeds=3, steps=80, seed_start=10)
    )


def test_any_subsequence_of_a_trace_still_runs() -> None:
    """Ops are intents: dropping a random half of a generated trace gives a valid trace
    that the correct engine passes (what makes shrinking sound)."""
    trace = generate_trace(3, 150)
    keep = np.random.default_rng(0).random(len(trace.ops)) < 0.5
    outcome = check_trace(trace.with_ops([op for op, k in zip(trace.ops, keep) if k]))
    assert failure_key(outcome) is None, outcome.describe()


def test_goals_are_read_from_what_happened() -> None:
    """A streaming session's second turn reuses the slot; an abort of a running request
    counts; the chunk cache never evicts; no EAGLE, no rejected draft."""
    ref = SessionRef(id="s")
    trace = Trace(
        name="goals",
        seed=1,
        engine=EngineSpec(
            enable_streaming_session=True,
            max_total_tokens=1024,
            context_len=256,
            chunked_prefill_size=32,
            cache="chunk",
        ),
        ops=[
            OpenSession(sid="s", streaming=True),
            Submit(rid="a", input_ids=list(range(60)), max_new_tokens=4, session=ref),
            WaitFor(rids=["a"]),
            Submit(rid="b", input_ids=[1, 2, 3], max_new_tokens=4, session=ref),
            WaitFor(rids=["b"]),
            Submit(rid="c", input_ids=list(range(9)), max_new_tokens=30),
            Step(n=4),
            Abort(rid="c"),
        ],
    )
    probe = FeatureProbe()
    outcome = run_trace(trace, default_catalog(), observers=[probe])
    met = goals_of(probe.features | outcome_features(outcome))
    assert met == {"session_reuse", "abort", "chunking"}  # an abort by rid names no phase
    assert "schedule:stream:append_few|ps1|full|overlap|spec_off" in probe.features


def test_failure_keys() -> None:
    """A drain that cannot reach idle within its budget is a liveness finding; a clean
    trace has no failure."""
    engine = EngineSpec(max_total_tokens=512, context_len=256)
    stuck = Trace(
        name="k",
        engine=engine,
        ops=[Submit(rid="a", input_ids=[1] * 8, max_new_tokens=50), Idle(max_steps=3)],
    )
    assert failure_key(check_trace(stuck)) == "liveness"
    assert failure_key(check_trace(stuck.with_ops(stuck.ops[:1]))) is None


def test_cli_explore_and_memory(tmp_path: Path) -> None:
    """`kvspec explore` prints the coverage and exits 0 (or 3 when a goal went unmet and
    coverage is required); `kvspec explore memory` still runs one memory cell; the CLI's
    defaults are the explorer's."""
    runner = CliRunner()
    args = ["explore", "--seeds", "2", "--steps", "60", "--out", str(tmp_path)]
    waived = runner.invoke(app, [*args, "--no-coverage"])
    assert waived.exit_code == 0, waived.output
    assert "sometimes goals" in waived.output and "explored 2 runs" in waived.output
    assert "(event, feature) pairs" in waived.output and (tmp_path / "report.json").exists()
    results = [run_seed(seed, 60) for seed in (0, 1)]  # the same seeds, through the library
    assert not any(r.failure for r in results)
    unmet = set(REQUIRED) - {goal for r in results for goal in r.goals}
    required = runner.invoke(app, args)
    assert required.exit_code == (3 if unmet else 0), required.output
    never = {goal for goal, (_, text) in REQUIRED.items() if f"NEVER: {text}" in required.output}
    assert never == unmet
    memory = runner.invoke(app, ["explore", "memory", "--requests", "12"])
    assert memory.exit_code == 0, memory.output
    assert (explore_cli.DEFAULT_SEEDS, explore_cli.DEFAULT_STEPS) == (DEFAULT_SEEDS, DEFAULT_STEPS)
