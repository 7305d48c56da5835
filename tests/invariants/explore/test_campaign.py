"""The coverage-guided campaign (campaign.py, mutate.py, features.py, branches.py): fresh
seeds first, then mutants of the runs that reached a new (event, feature) pair or engine arc;
every mutant a valid trace; the whole campaign a pure function of its first seed."""

from __future__ import annotations

import numpy as np

from invariants.explore.branches import BranchMeter
from invariants.explore.campaign import Campaign, Run, run_one
from invariants.explore.generate import generate_trace, scheduled
from invariants.explore.mutate import mutate, mutate_engine, renamed
from invariants.scenarios.matrix_axes import axis_values, violations
from invariants.scenarios.ops import (
    CloseSession,
    FlushCache,
    Idle,
    OpenSession,
    SessionRef,
    Submit,
    Trace,
    WaitFor,
)

STEPS = 60


def run_campaign(budget: int) -> tuple[Campaign, list]:
    campaign = Campaign(budget, STEPS, seed_start=5, fresh=4, batch=4)
    results = []
    while not campaign.done:
        generation = [run_one(run, STEPS) for run in campaign.next_generation()]
        campaign.take(generation)
        results += generation
    return campaign, results


def test_fresh_seeds_first_then_mutants_of_the_runs_that_reached_something_new():
    """Runs 0-3 are seeds 5-8; later runs are mutants ("seed S mI") of kept runs; a run joins
    the corpus only if it reached a pair or an arc no earlier run had (the first always)."""
    campaign, results = run_campaign(10)
    assert [r.name for r in results[:4]] == ["seed 5", "seed 6", "seed 7", "seed 8"]
    assert all(" m" in r.name and r.index >= 4 for r in results[4:])
    assert all(campaign.runs[r.index].trace is not None for r in results[4:])
    assert campaign.corpus and campaign.corpus[0].seed == 5 and campaign.corpus[0].added > 0
    assert not any(r.failure for r in results), [(r.name, r.detail) for r in results]


def test_a_campaign_is_a_pure_function_of_its_first_seed():
    """The same campaign twice draws the same mutants (trace for trace) and gets the same
    results, features and arcs."""
    first, a = run_campaign(8)
    second, b = run_campaign(8)
    key = [(r.name, r.failure, r.features, r.arcs, r.steps) for r in a]
    assert key == [(r.name, r.failure, r.features, r.arcs, r.steps) for r in b]
    assert [first.trace_of(i) for i in range(8)] == [second.trace_of(i) for i in range(8)]


def test_every_mutant_is_a_valid_trace():
    """Mutants keep a matrix-valid engine the engine accepts, unique request ids, no more
    scheduled iterations than a seed, and the drain (closes, idle, flush) at the end."""
    rng = np.random.default_rng(0)
    donors = [generate_trace(s, STEPS) for s in range(3)]
    for k in range(40):
        parent = donors[k % 3]
        mutant = mutate(parent, rng, donors, f"m{k}", STEPS)
        assert not violations(axis_values(mutant.engine.model_dump()))
        mutant.engine.engine_config(0)  # raises ConfigError if the engine refuses it
        rids = [op.rid for op in mutant.ops if isinstance(op, Submit)]
        assert len(rids) == len(set(rids))
        assert isinstance(mutant.ops[-1], FlushCache) and isinstance(mutant.ops[-2], Idle)
        safety = mutant.ops[: next(i for i, op in enumerate(mutant.ops) if isinstance(op, Idle))]
        assert scheduled(safety) <= STEPS


def test_a_configuration_mutation_redraws_one_knob_and_refits_the_pools():
    """A page size mutation keeps the pools page-aligned and the context limit fitting."""
    engine = generate_trace(1, STEPS).engine
    rng = np.random.default_rng(3)
    changed = [mutate_engine(engine, rng) for _ in range(30)]
    assert any(e != engine for e in changed)
    for e in changed:
        assert e.max_total_tokens % e.page_size == 0 and e.context_len >= 64


def test_a_mutant_engine_is_one_the_engine_accepts():
    """Session tags over the radix tree need the radix cache without SWA: a mutation to the
    chunk cache or to SWA drops them (found by a streamed campaign on Ray: seed 34 m134 was
    refused as a configuration)."""
    engine = next(
        e
        for e in (generate_trace(seed, STEPS).engine for seed in range(50))
        if e.cache == "radix" and not e.swa_tokens
    ).model_copy(update={"session_radix_cache": True})
    rng = np.random.default_rng(0)
    for mutant in [mutate_engine(engine, rng) for _ in range(200)]:
        mutant.engine_config(0)  # raises ConfigError on a refused configuration
        assert mutant.session_radix_cache == (mutant.cache == "radix" and not mutant.swa_tokens)


def test_renamed_ops_keep_their_references():
    """Splicing renames a stretch's requests and sessions, and what refers to them."""
    ops = [
        OpenSession(sid="s0", streaming=True),
        Submit(rid="r1", input_ids=[5], max_new_tokens=2, session=SessionRef(id="s0", rid="r0")),
        WaitFor(rids=["r1"]),
        CloseSession(sid="s0"),
    ]
    out = renamed(ops, "x")
    assert [getattr(op, "sid", None) for op in out] == ["x-s0", None, None, "x-s0"]
    submit = out[1]
    assert isinstance(submit, Submit) and submit.rid == "x-r1"
    assert submit.session == SessionRef(id="x-s0", rid="x-r0")
    assert isinstance(out[2], WaitFor) and out[2].rids == ["x-r1"]


def test_the_branch_meter_names_engine_arcs_by_module():
    """The arcs of the engine's decision code a run executed, named ``module:from>to``."""
    result = run_one(Run(0, 2), STEPS)
    assert result.arcs and all(":" in a and ">" in a for a in result.arcs)
    assert any(a.startswith("sched/scheduler.py:") for a in result.arcs)
    assert not any(a.startswith(("observe/", "model/")) for a in result.arcs)
    meter = BranchMeter()
    assert meter.arcs() == frozenset()  # never started: nothing measured


def test_trace_ops_without_a_drain_are_their_own_safety_part():
    """A hand-written trace with no drain is all safety ops."""
    trace = Trace(ops=[Submit(rid="a", input_ids=[1], max_new_tokens=1)])
    rng = np.random.default_rng(1)
    mutant = mutate(trace, rng, [], "m0", STEPS)
    assert isinstance(mutant.ops[-1], FlushCache)
