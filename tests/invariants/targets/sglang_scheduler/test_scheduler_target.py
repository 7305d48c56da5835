"""SGLang's real scheduler under the catalog, release by release (`make test-sglang`): 0.5.23
runs kvspec's default specs clean at level 2; 0.5.10.post1 leaks a page when a streaming turn
is retracted (#22862) — the census names the page while SGLang's checker, that iteration, is
silent — and 0.5.11, the release with the fix, runs the same trace clean. The findings explore
made on each release, each read against that release's code (docs/benchmarks.md, *kvspec sglang
history*), are pinned here as the shrunk traces under traces/."""

from __future__ import annotations

from pathlib import Path

import pytest

from invariants.checking.loader import shipped_catalog
from invariants.report.cells import default_specs
from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import load_spec
from invariants.targets.explore import failure_key
from invariants.targets.outcome import disagreements
from invariants.targets.registry import target
from invariants.targets.run import run_spec, run_trace
from invariants.targets.sglang_scheduler.history import pages_named

pytestmark = pytest.mark.sglang
SCHEDULER = target("sglang-scheduler")
LEAK = Path(__file__).parent / "traces" / "retracted-streaming-turn-leak.json"
SPECS = Path(__file__).resolve().parents[4] / "specs"


WEDGES = "session-wedge"  # a finding on every release: test_a_burst_of_streaming_sessions_wedges
CLEAN = [(n, p) for n, p in default_specs() if n != WEDGES]


@pytest.mark.parametrize("name,path", CLEAN, ids=[n for n, _ in CLEAN])
def test_default_specs_run_clean_on_0_5_23(latest, name, path):
    """Every default spec the real scheduler can express runs on 0.5.23 with no violation,
    no message from SGLang's own checkers and no crash (a spec it cannot express is said to
    be unsupported, with the reason, before anything runs) — but session-wedge, below."""
    outcome = run_spec(SCHEDULER, load_spec(path), shipped_catalog(), driver=latest)
    if outcome.unsupported:
        pytest.skip(f"unsupported on the real scheduler: {'; '.join(outcome.unsupported)}")
    assert outcome.ok, (outcome.violations[:3], outcome.findings[:3], outcome.error)
    assert outcome.stats.finished > 0 and outcome.checks > 0


def test_a_burst_of_streaming_sessions_wedges_0_5_23(latest):
    """#27024 on 0.5.23: sixteen streaming sessions pin their first turns' KV (slot locks:
    protected, never evictable) in a 2048-token pool, and the sixteen second turns wait with
    nothing running, no batch, 40 tokens free and nothing evictable, from iteration 40 on —
    SGLang has no admission control over pinned KV and nothing that releases an idle slot, so
    its loop spins forever. kvspec's stepper names it ``engine.stall`` once no request has
    finished for 4,096 steps (kvspec's engine reclaims idle slots: engine/sched/wedge.py)."""
    outcome = run_spec(
        SCHEDULER, load_spec(SPECS / f"{WEDGES}.yaml"), shipped_catalog(), driver=latest
    )
    assert [v.invariant for v in outcome.violations] == ["engine.stall"], outcome.violations
    assert "no request finished in 4096 steps: unfinished s0t2" in outcome.violations[0].message
    assert outcome.stats.finished == 16  # every first turn, then nothing


def test_0_5_10_post1_leaks_the_page_of_a_retracted_streaming_turn(unfixed):
    """#22862: the second turn of a streaming session is retracted and re-matched; the
    release's match overwrites the slot's row from the doubly-reserved prefix length, so the
    page that held the first turn's KV is neither free nor owned. The census names page 1 at
    the iteration it leaks, and SGLang's own checkers say nothing then."""
    outcome = run_trace(SCHEDULER, Trace.load(LEAK), shipped_catalog(), driver=unfixed)
    first = outcome.violations[0]
    view = [v for v in outcome.violations if v.step == first.step]
    assert {"pool.busy_sum", "census.no_orphans"} <= {v.invariant for v in view}
    assert pages_named(view) == (1,)
    assert first.step not in {f.iteration for f in outcome.findings}  # a bug SGLang cannot see
    assert any(d.kind == "kvspec-only" for d in disagreements(outcome, "SGLang"))


def test_0_5_10_post1_leaks_the_tail_of_a_bare_continue_turn(unfixed, fixed):
    """#22862 through the default spec alone: streaming-sessions' bare continue turns (BOS
    alone) make the history the whole key, so 0.5.10.post1's restore takes the prefix one
    token short of the slot (the logit reserve twice) and overwrites the row from there,
    leaving the slot's last page neither free nor owned; 0.5.11 frees that tail first
    (``_free_tail``) and runs the same spec clean."""
    spec = load_spec(Path("specs/streaming-sessions.yaml"))
    leaky = run_spec(SCHEDULER, spec, shipped_catalog(), driver=unfixed)
    assert {"pool.busy_sum", "census.no_orphans"} <= {v.invariant for v in leaky.violations}
    clean = run_spec(SCHEDULER, spec, shipped_catalog(), driver=fixed)
    assert clean.ok, (clean.violations[:3], clean.findings[:3], clean.error)


def test_0_5_11_runs_the_leaking_trace_clean(fixed):
    """0.5.11 frees the stale tail before the re-match (``StreamingSession._free_tail``): the
    same trace is clean."""
    outcome = run_trace(SCHEDULER, Trace.load(LEAK), shipped_catalog(), driver=fixed)
    assert outcome.ok, (outcome.violations[:3], outcome.findings[:3], outcome.error)


def test_0_5_10_post1_busy_check_over_counts_session_turns(unfixed):
    """#22213: during a turn of a streaming session, 0.5.10.post1's busy check counts the
    slot's tokens and the borrowing request's tokens twice ("Mem Leak Detected!") while
    kvspec's census and sums hold at those iterations: a false positive in SGLang's checker.
    (Without the spec's bare continue turns: on 0.5.10.post1 those hit #22862's real leak,
    pinned on its own: test_0_5_10_post1_leaks_the_tail_of_a_bare_continue_turn.)"""
    spec = load_spec(Path("specs/streaming-sessions.yaml"))
    sessions = spec.workload.sessions.model_copy(update={"continuing": 0.0})
    workload = spec.workload.model_copy(update={"sessions": sessions})
    spec = spec.model_copy(update={"workload": workload})
    outcome = run_spec(SCHEDULER, spec, shipped_catalog(), driver=unfixed)
    assert not outcome.violations and not outcome.error
    positives = [d for d in disagreements(outcome, "SGLang") if d.kind == "engine-only"]
    assert positives and all("Mem Leak Detected" in d.detail for d in positives)


def test_replacing_all_of_a_sessions_requests_crashes_the_scheduler(latest):
    """Found by explore on 0.5.11, present in every release checked: a non-streaming session
    turn with ``replace=True`` and no ``rid`` clears the session's request nodes while
    iterating over them (``Session.create_req``: ``for _, req_node in
    self.req_nodes.items(): req_node.clear(self.req_nodes)``, which deletes from that dict),
    so one request raises in the scheduler's loop and takes the server down."""
    trace = Trace.load(LEAK.with_name("session-replace-all-crash.json"))
    outcome = run_trace(SCHEDULER, trace, shipped_catalog(), driver=latest)
    assert outcome.error is not None
    assert "dictionary changed size during iteration" in outcome.error
    assert "session_controller.py" in outcome.error and "create_req" in outcome.error
    assert [v.invariant for v in outcome.violations] == ["engine.exception"]  # the crash event
    assert (
        failure_key(outcome)
        == "engine.exception@sglang/srt/session/session_controller.py:create_req"
    )


def test_two_first_turns_of_a_streaming_session_in_one_iteration_crash_the_scheduler(latest):
    """Found by explore on 0.5.23: two turns sent to a new streaming session reach one
    ``recv_requests``. ``Session.create_req`` rejects the second (the session is in flight)
    but still hands back a request bound to the session, which is scheduled as a one-token
    stub; when its row is allocated, ``StreamingSession.take`` finds the first turn's slot and
    asserts (``session_id=... already has a slot``): one client retry takes the server down.
    Upstream's open #40252 ("a session request rejected at create_req ... was still scheduled
    as a 1-token stub") names the same path."""
    trace = Trace.load(LEAK.with_name("streaming-two-first-turns-crash.json"))
    outcome = run_trace(SCHEDULER, trace, shipped_catalog(), driver=latest)
    assert outcome.error is not None and "already has a slot" in outcome.error
    assert "streaming_session.py" in outcome.error and "in take" in outcome.error
    key = failure_key(outcome)  # whole: the rule and the raising site, never cut mid-path
    assert (
        key is not None
        and key.startswith("engine.exception@sglang/srt/")
        and key.endswith("streaming_session.py:take")
    )


def test_a_retracted_streaming_turn_clears_the_sessions_in_flight_flag(latest):
    """Found by explore on 0.5.11 and 0.5.23 (upstream's open #40252): a retracted streaming
    turn goes through ``try_cache_finished_req`` like a finished one, so
    ``Session.finish_req`` clears ``_inflight`` and makes the still-waiting turn the
    session's history. ``session.single_live_request`` names it at the retract's
    iteration (a live request, in flight False) while SGLang's checkers are silent."""
    trace = Trace.load(LEAK.with_name("retracted-turn-clears-inflight.json"))
    outcome = run_trace(SCHEDULER, trace, shipped_catalog(), driver=latest)
    first = outcome.violations[0]
    assert first.invariant == "session.single_live_request" and "inflight=False" in first.message
    assert first.step not in {f.iteration for f in outcome.findings}


def test_0_5_10_post1_leaks_a_slot_closed_under_a_rejected_turn(unfixed):
    """Found by explore on 0.5.10.post1: a streaming turn rejected at ``create_req`` (a
    non-zero offset) is still scheduled with its session; the session closes in the same
    iteration, and when the stub finishes ``cache_finished_req`` makes a new slot for the
    closed session. kvspec names the orphaned slot and SGLang's busy check over-counts by the
    stub's token at the same iteration; 0.5.11 hands an aborted turn's record back instead."""
    trace = Trace.load(LEAK.with_name("close-under-rejected-turn-leaks-slot.json"))
    outcome = run_trace(SCHEDULER, trace, shipped_catalog(), driver=unfixed)
    first = outcome.violations[0]
    assert first.invariant == "session.slot_has_open_session"
    assert first.step in {f.iteration for f in outcome.findings}  # both sides saw it


def test_a_turn_rejected_while_one_runs_clears_the_flag_and_a_retry_crashes(latest):
    """Found by `kvspec explore --target sglang-server` on 0.5.23, and simpler than the two
    first turns: no shared receive needed. Turn 2 of a streaming session sent while turn 1
    runs is rejected ("already has an active request"), but the rejected request is bound to
    the session, and its abort calls ``Session.abort_req``, clearing ``_inflight`` while turn
    1 still runs (``session.single_live_request``, SGLang's checkers silent). The client's
    retry is then accepted beside turn 1; once turn 1 saves its slot, the retry's prefix
    match asserts (``streaming session prefix shrank``) and the scheduler dies."""
    trace = Trace.load(LEAK.with_name("streaming-retried-turn-crash.json"))
    outcome = run_trace(SCHEDULER, trace, shipped_catalog(), driver=latest)
    first = outcome.violations[0]
    assert first.invariant == "session.single_live_request" and "inflight=False" in first.message
    assert first.step not in {f.iteration for f in outcome.findings}
    level1 = run_trace(SCHEDULER, trace, shipped_catalog(), 1, driver=latest)
    assert level1.crash is not None and "prefix shrank" in level1.crash.message
    assert level1.crash.site.endswith("streaming_session.py:try_match_prefix")
