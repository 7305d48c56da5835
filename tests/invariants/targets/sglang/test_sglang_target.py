"""Real SGLang 0.5.23 under kvspec's catalog: the same invariants hold, faults are caught, and
the differential against kvspec's engine finds only declared gaps."""

from __future__ import annotations

import pytest

from invariants.scenarios.ops import Idle, Submit
from invariants.scenarios.spec import load_spec
from invariants.targets.registry import TargetOptions, target
from invariants.targets.run import run_spec, run_trace
from invariants.targets.sglang import differential as differential_module
from invariants.targets.sglang import gaps
from invariants.targets.sglang.adapter import open_driver
from invariants.targets.sglang.differential import differential
from invariants.targets.sglang.scenarios import prefix_scenario, sessions_scenario
from invariants.targets.views import buckets

pytestmark = pytest.mark.sglang
SGLANG = target("sglang")
DIFF_SPEC = "specs/sglang-diff-sessions.yaml"


def test_prefix_reuse_counts_match_the_feasibility_study(catalog, driver):
    """A prefix hit, then eviction (pool 64, page 1), with the counts worked out by hand from
    SGLang's code: r1's finish leaves 41 free / 23 evictable; r2 hits 16 tokens; every view
    passes the whole catalog."""
    outcome = run_trace(SGLANG, prefix_scenario(), catalog, driver=driver, keep_views=True)
    assert outcome.ok, outcome.violations[:3] or outcome.error
    after_r1 = [buckets(v) for v in outcome.views if v.event == "step"][3]
    assert after_r1 == {
        "free": 41,
        "evictable": 23,
        "protected": 0,
        "session_held": 0,
        "request_owned": 0,
    }
    assert outcome.stats.cached_tokens == 16 and outcome.version == "0.5.23"


def test_eviction_pressure_spec_holds_every_invariant(catalog, driver):
    """radix-eviction.yaml's trace (the runner's build_trace) on real SGLang: all requests
    finish, tokens are evicted and reused, and no invariant is violated at any step."""
    outcome = run_spec(SGLANG, load_spec("specs/radix-eviction.yaml"), catalog, driver=driver)
    assert outcome.ok and not outcome.unmet, (
        outcome.violations[:3] or outcome.error or outcome.unmet
    )
    assert (
        outcome.stats.finished == 96 and outcome.stats.evicted_tokens > 0 and outcome.checks > 1000
    )


def test_swa_hybrid_spec_holds_every_invariant_on_both_pools(catalog, driver):
    """swa-hybrid.yaml on SGLang's SWATokenToKVPoolAllocator + UnifiedRadixCache(FULL, SWA):
    the real maybe_evict_swa slides windows (cursors advance, tree SWA values tombstone), and
    both pools' sums, censuses and the SWA tree rules hold at every step."""
    outcome = run_spec(
        SGLANG, load_spec("specs/swa-hybrid.yaml"), catalog, driver=driver, keep_views=True
    )
    assert not outcome.violations and outcome.error is None and not outcome.unmet, (
        outcome.violations[:3]
    )
    views = outcome.views
    assert all([p.name for p in v.pools] == ["full", "swa"] for v in views)
    assert max(r.swa_evicted_seqlen for v in views for r in v.reqs) > 0
    assert (
        any(n.swa_tombstone for v in views for n in v.tree.nodes)
        and views[-1].tree.kind == "swa_radix"
    )
    assert outcome.notes and "chunked prefill" in outcome.notes[0]


def test_streaming_sessions_with_aborts_hold_every_invariant(catalog, driver):
    """Two streaming sessions over three turns, an aborted running turn, an aborted queued
    request, close and eviction pressure: slots hold KV between turns, close releases it."""
    outcome = run_trace(SGLANG, sessions_scenario(), catalog, driver=driver, keep_views=True)
    assert outcome.ok, outcome.violations[:3] or outcome.error
    assert outcome.stats.aborted == 2 and outcome.stats.evicted_tokens > 0
    assert any(v.slots and not any(s.borrowed for s in v.slots) for v in outcome.views)
    assert not outcome.views[-1].slots and outcome.views[-1].event == "idle"


@pytest.mark.parametrize(
    "kind, invariant",
    [("skip_free", "census.no_orphans"), ("double_free", "census.free_list_unique")],
)
def test_fault_on_the_real_allocator_is_named_by_slot_id(catalog, driver, kind, invariant):
    """A skipped free (leak) or a double free patched into SGLang's allocator breaks its sum
    and the census names the very slots the fault touched."""
    fault = {"kind": kind, "step": 1}
    outcome = run_trace(SGLANG, sessions_scenario(), catalog, driver=driver, fault=fault)
    found = [v for v in outcome.violations if v.invariant == invariant]
    assert found and any(v.invariant == "pool.busy_sum" for v in outcome.violations)
    named = [int(x) for x in found[0].message.split("[")[1].rstrip("]").split(",")]
    assert named and set(named) <= set(outcome.faults[0]["slots"])


def test_differential_over_sessions_and_aborts_has_only_declared_gaps(driver):
    """sglang-diff-sessions.yaml in lockstep on kvspec and SGLang: same batches, every step's
    buckets equal or differing by a declared gap (eviction amount; a borrowed session row)."""
    result = differential(load_spec(DIFF_SPEC), driver=driver)
    assert result.steps == len(result.kvspec) == len(result.sglang) > 20
    assert result.ok, [str(d) for d in result.unexpected[:5]]
    gaps = {d.gap for d in result.differences}
    assert gaps == {"eviction.amount", "session.borrowed_row_is_request_owned"}
    assert any(row["session_held"] for row in result.sglang)


def test_differential_reports_an_undeclared_difference_with_its_step_and_op(driver):
    """A leak patched into SGLang's allocator (one skipped free) moves its buckets off
    kvspec's by a sum no gap explains: reported as UNEXPECTED, with step and op."""
    result = differential(
        load_spec(DIFF_SPEC), driver=driver, fault={"kind": "skip_free", "step": 5}
    )
    first = result.unexpected[0]
    assert not result.ok and first.step >= 5 and first.bucket in ("free", "evictable")
    assert first.op and "UNEXPECTED" in str(first)


def test_differential_of_swa_hybrid_has_only_declared_gaps(driver):
    """swa-hybrid.yaml in lockstep: SGLang 0.5.23 keeps only the window of a checkpointed
    request's SWA KV (kvspec follows 0.5.11's whole-node SWA lock) and stops a branch insert
    at the live window; both are declared, the full pool's free/evictable otherwise agree."""
    result = differential(load_spec("specs/swa-hybrid.yaml"), driver=driver)
    assert result.steps == len(result.sglang) > 100
    assert result.ok, [str(d) for d in result.unexpected[:5]]
    gaps = {d.gap for d in result.differences}
    assert {"swa.window_only_at_checkpoint", "swa.branch_insert_stops_at_live_window"} <= gaps
    assert (
        result.kvspec[0]["swa.protected"] > result.sglang[0]["swa.protected"] == 96
    )  # 3 requests x window


def test_a_turn_refused_after_the_session_accepted_it_is_its_live_request(catalog, driver):
    """streaming-aborts.yaml: a too-long turn passes Session.create_req (the session goes in
    flight), then the prompt-length check refuses it and it queues for a 1-token prefill; the
    view counts it as the session's live request meanwhile, so single-live-request holds."""
    outcome = run_spec(
        SGLANG, load_spec("specs/streaming-aborts.yaml"), catalog, driver=driver, keep_views=True
    )
    assert not outcome.violations and outcome.error is None, outcome.violations[:3]
    assert outcome.stats.rejected > 0
    refused = [
        (s.inflight, s.live_reqs)
        for v in outcome.views
        for r in v.reqs
        if r.rid.endswith("!long")
        for s in v.sessions
        if r.rid.startswith(f"{s.session_id}t")
    ]
    assert refused and all(state == (True, 1) for state in refused)


@pytest.mark.parametrize("name, steps", [("session-control", 57), ("streaming-aborts", 160)])
def test_differential_retires_a_request_rejected_at_submission(driver, name, steps):
    """A request refused at submission (rejected parameters, too long) is retired by kvspec
    before any KV is touched, so kvspec never plans SGLang's 1-token stub of it; in lockstep
    the glue retires it at the next step as 0.5.23 retires a request refused at the door, so
    a streaming session whose first turn was refused takes its next turn on both targets
    (streaming-aborts: s0t1!param, then s0t2) and both targets end idle."""
    result = differential(load_spec(f"specs/{name}.yaml"), driver=driver)
    assert result.ok, [str(d) for d in result.unexpected[:5]]
    assert result.steps == len(result.sglang) == steps


def test_differential_drain_gives_sglang_the_iteration_that_retires_a_last_rejected_request(
    driver, monkeypatch
):
    """A too-long request submitted after everything is idle leaves kvspec idle at once; the
    drain steps once more, in which SGLang retires it, so both end idle, with no difference."""
    real_build = differential_module.build_trace

    def with_late_rejected(spec):
        trace = real_build(spec)
        late = Submit(rid="late!long", input_ids=[5] * 4096, max_new_tokens=4)
        return trace.model_copy(update={"ops": [*trace.ops, Idle(), late]})

    monkeypatch.setattr(differential_module, "build_trace", with_late_rejected)
    plain = differential(load_spec(DIFF_SPEC), driver=driver)
    monkeypatch.undo()
    assert plain.ok, [str(d) for d in plain.unexpected[:5]]
    assert plain.steps == differential(load_spec(DIFF_SPEC), driver=driver).steps + 1


def test_differential_of_streaming_many_turns_has_only_declared_gaps(driver):
    """streaming-many-turns.yaml (8 SWA streaming sessions x 12 turns) in lockstep: from turn 2
    on SGLang 0.5.23's slots keep the SWA KV that slid out of the window until 128 tokens have
    (kvspec frees it on 0.5.11's decode-step cadence) — declared as swa.eviction_cadence, with
    the window-only checkpoint and the borrowed row; nothing else differs."""
    result = differential(load_spec("specs/streaming-many-turns.yaml"), driver=driver)
    assert result.steps == len(result.sglang) > 300
    assert result.ok, [str(d) for d in result.unexpected[:5]]
    gaps = {part for d in result.differences for part in d.gap.split("+")}
    assert {
        "swa.eviction_cadence",
        "swa.window_only_at_checkpoint",
        "session.borrowed_row_is_request_owned",
    } <= gaps
    assert any(
        theirs["swa.session_held"] > ours["swa.session_held"] + ours["swa.request_owned"]
        for ours, theirs in zip(result.kvspec, result.sglang)
    )


def test_streaming_many_turns_needs_no_cadence_gap_at_sglang_every_step_cadence(monkeypatch):
    """With 0.5.23's SWA eviction every decode step (SGLANG_SWA_EVICTION_INTERVAL=1) SGLang's
    rows never keep more SWA than 0.5.11's every-window cadence, so streaming-many-turns is
    clean without swa.eviction_cadence: both evict from the same decode step on (0.5.x's
    maybe_evict_swa runs before the decode allocation and before decode_batch_idx is counted,
    so never at a request's first decode — engine/memory.py maybe_evict_swa does the same)."""
    monkeypatch.setenv("SGLANG_SWA_EVICTION_INTERVAL", "1")
    monkeypatch.setattr(gaps, "GAPS", tuple(g for g in gaps.GAPS if g.id != "swa.eviction_cadence"))
    with open_driver(TargetOptions()) as live:
        result = differential(load_spec("specs/streaming-many-turns.yaml"), driver=live)
    assert result.ok, [str(d) for d in result.unexpected[:5]]
