"""kvspec's scheduler beside SGLang's real one (`kvspec sglang lockstep`): how two iterations
are compared, which declared gaps explain a difference (and only in their situation), how the
trace is equalized, and what the command prints and exits with. The last tests run real
SGLang (`-m sglang`) and pin the result established on 0.5.23."""

from __future__ import annotations

from pathlib import Path

import pytest

from invariants.cli import main
from invariants.scenarios.ops import Idle, OpenSession, Step, Submit, Trace
from invariants.scenarios.spec import EngineSpec, load_spec
from invariants.targets.sglang_scheduler.commands import print_lockstep
from invariants.targets.sglang_scheduler.gaps import Ledger, Situation, pool_gaps, sched_gap
from invariants.targets.sglang_scheduler.known import likely_causes
from invariants.targets.sglang_scheduler.lockstep import (
    Divergence,
    GapHit,
    LockstepResult,
    equalized,
    lockstep_spec,
    lockstep_trace,
)
from invariants.targets.sglang_scheduler.lockstep_records import Batch, Iteration, compare

SPECS = Path(__file__).resolve().parents[4] / "specs"
POOL = dict(free=100, evictable=20, protected=30, session_held=0, request_owned=10)
OVERLAP = dict(page_size=1, overlap=True, streaming=False, sessions=False, parents={})


def it(number: int, batch: Batch, **buckets: int) -> Iteration:
    return Iteration(number, batch, {**POOL, **buckets})


def decode(*rids: str, finished: tuple[str, ...] = ()) -> Batch:
    return Batch("decode", tuple((rid, 1) for rid in rids), (), finished)


def situation(ours, theirs, version="0.5.23", config=None, ledger=None, op=None, before=None):
    """``before``: SGLang's iteration before (and kvspec's, when ``theirs`` is None)."""
    mine = before if theirs is None else None
    config, ledger = config or OVERLAP, ledger or Ledger()
    return Situation(op, ours, theirs, config, before, version, ledger, mine)


# ---- comparing two iterations ----


def test_equal_iterations_agree_whatever_the_order_within_the_batch():
    """Requests compare as sets: the order inside a batch is no scheduling decision."""
    a = it(3, Batch("extend", (("r1", 64), ("r2", 10))))
    b = it(3, Batch("extend", (("r2", 10), ("r1", 64))))
    assert compare(a, b) == ()


def test_each_aspect_of_an_iteration_is_named_when_it_differs():
    """Mode, request set, new tokens per request (only when the set is equal), retractions
    and each pool bucket are separate aspects."""
    ours = it(5, Batch("extend", (("r1", 64),), ("r0",)), free=90)
    assert compare(ours, it(5, Batch("mixed", (("r1", 63),), ("r0",)), free=90)) == (
        "mode",
        "tokens",
    )
    assert compare(ours, it(5, Batch("extend", (("r2", 64),), ("r0",)), free=90)) == ("requests",)
    assert compare(ours, it(5, Batch("extend", (("r1", 64),)), free=91)) == ("retracted", "free")


def test_a_batch_prints_each_request_with_its_new_tokens():
    """The printed batch is the one a person compares: mode, rid+tokens, retracted, finished."""
    batch = Batch("mixed", (("r3", 40), ("r1", 1)), ("r2",), ("r1",))
    assert str(batch) == "mixed[r3+40 r1+1] retracted [r2] finished [r1]"


# ---- declared gaps, each only in its situation ----


def test_a_decode_0_5_23_skips_is_declared_only_for_requests_kvspec_finished_then():
    """overlap.skip_finishing_decode: SGLang's decode lacks requests kvspec finished in the
    same iteration — declared on 0.5.23 with overlap on; a missing request kvspec did not
    finish, the same case on another release, or overlap off is a divergence."""
    ours = it(9, decode("r0", "r1", "r2", finished=("r0",)))
    theirs = it(9, decode("r1", "r2"))
    gap = sched_gap("requests", situation(ours, theirs))
    assert gap is not None and gap.id == "overlap.skip_finishing_decode"
    assert sched_gap("requests", situation(it(9, decode("r0", "r1", "r2")), theirs)) is None
    assert sched_gap("requests", situation(ours, theirs, version="0.5.10.post1")) is None
    no_overlap = {**OVERLAP, "overlap": False}
    assert sched_gap("requests", situation(ours, theirs, config=no_overlap)) is None


def test_applying_the_skip_gap_records_the_skipped_requests():
    """A gap's note updates the run's ledger, which bounds the gaps that follow from it."""
    ledger = Ledger()
    s = situation(it(9, decode("r0", "r1", finished=("r0",))), it(9, decode("r1")), ledger=ledger)
    gap = sched_gap("requests", s)
    assert gap is not None and gap.note is not None
    gap.note(s)
    assert ledger.skipped == {"r0"}


def test_the_last_token_kvspec_cached_is_bounded_by_the_decodes_skipped():
    """overlap.finished_last_token_cached: kvspec may hold up to a page per skipped decode
    more (in no bucket less), its free as much lower; one token beyond the bound, or a
    bucket where kvspec holds less, is a divergence."""
    theirs = it(10, decode("r1"))
    one = situation(
        it(10, decode("r1"), free=99, evictable=21), theirs, ledger=Ledger(skipped={"r0"})
    )
    assert pool_gaps(one) == ("overlap.finished_last_token_cached",)
    two = situation(
        it(10, decode("r1"), free=98, evictable=22), theirs, ledger=Ledger(skipped={"r0"})
    )
    assert pool_gaps(two) is None
    less = situation(
        it(10, decode("r1"), free=99, evictable=19, protected=32),
        theirs,
        ledger=Ledger(skipped={"r0"}),
    )
    assert pool_gaps(less) is None
    assert pool_gaps(situation(one.kvspec, theirs)) is None  # nothing skipped: no allowance


def test_a_streaming_turn_1_chunk_may_be_protected_on_sglang_only():
    """session.turn1_chunks_published: with streaming sessions on 0.5.23, tokens SGLang's
    tree protects may sit in kvspec's rows; the other way round is a divergence."""
    streaming = {**OVERLAP, "overlap": False, "streaming": True, "sessions": True}
    ours = it(2, decode("s0t1"), protected=30, request_owned=18)
    theirs = it(2, decode("s0t1"), protected=38, request_owned=10)
    assert pool_gaps(situation(ours, theirs, config=streaming)) == (
        "session.turn1_chunks_published",
    )
    assert pool_gaps(situation(theirs, ours, config=streaming)) is None
    assert pool_gaps(situation(ours, theirs, config={**streaming, "streaming": False})) is None


def test_a_refused_request_s_stand_in_prefill_is_declared_for_rejected_rids_only():
    """session.refused_stand_in_prefill: SGLang's batch may carry a one-token prefill of a
    request kvspec rejected at submission, never of one kvspec accepted."""
    ours = it(24, Batch("extend", (("s1t3", 22),)))
    theirs = it(24, Batch("extend", (("s0t3!param", 1), ("s1t3", 22))))
    rejected = situation(ours, theirs, ledger=Ledger(rejected={"s0t3!param"}))
    gap = sched_gap("requests", rejected)
    assert gap is not None and gap.id == "session.refused_stand_in_prefill"
    assert sched_gap("requests", situation(ours, theirs)) is None


def test_kvspec_s_last_idle_iteration_of_a_drain_is_declared_when_it_changes_nothing():
    """drain.idle_probe: kvspec's run_until_idle ends with empty iterations SGLang does not
    run; each is declared when it ran nothing and left the pool as it was, not otherwise."""
    before = it(40, decode("r1"))
    extra = it(41, Batch("idle"))
    probe = sched_gap("iterations", situation(extra, None, op=Idle(), before=before))
    assert probe is not None and probe.id == "drain.idle_probe"
    moved = it(41, Batch("idle"), free=101, evictable=19)
    assert sched_gap("iterations", situation(moved, None, op=Idle(), before=before)) is None
    assert sched_gap("iterations", situation(extra, None, op=Step(), before=before)) is None


def test_a_refill_right_after_a_finish_is_named_as_its_known_cause():
    """A known divergence (no gap: it shifts the schedules for good) is recognised and named:
    0.5.23 refills a full batch in the iteration after a request finished."""
    before = it(23, decode("r0", "r1", finished=("r0",)))
    ours, theirs = it(24, decode("r1")), it(24, Batch("extend", (("r12", 148),)))
    causes = likely_causes(situation(ours, theirs, before=before))
    assert [c.id for c in causes] == ["sched.running_batch_filtered_each_iteration"]
    assert likely_causes(situation(ours, theirs, before=before, version="0.5.11")) == ()


def test_a_turn_sglang_answers_with_a_stand_in_is_named_as_0_5_11_s_inflight_flag():
    """On 0.5.11 a session turn SGLang runs as a one-token stand-in while kvspec prefills it
    is named as the in-flight flag a queued abort left set (kvspec closes that gap)."""
    config = {**OVERLAP, "parents": {"s3t3": "s3t2"}}
    ours = it(71, Batch("extend", (("s3t3", 9), ("s4t3", 12))))
    theirs = it(71, Batch("extend", (("s3t3", 1), ("s4t3", 20))))
    causes = likely_causes(situation(ours, theirs, version="0.5.11", config=config))
    assert [c.id for c in causes] == ["session.inflight_kept_after_queued_abort"]


# ---- the trace, equalized ----


def test_inputs_neither_side_can_share_are_equalized_on_both_and_said():
    """EOS off (token values differ by design), logprob requests plain (the target sends
    none), a session turn's leading BOS stripped (the target's SGLang has no tokenizer);
    each change is a note, and an unchanged trace has none."""
    trace = Trace(
        engine=EngineSpec(eos_prob=0.1),
        ops=[
            OpenSession(sid="s0"),
            Submit(rid="a", input_ids=[256, 5, 6], max_new_tokens=2, return_logprob=True),
            Submit(rid="b", input_ids=[256, 7], max_new_tokens=2, session={"id": "s0"}),
        ],
    )
    same, notes = equalized(trace)
    assert same.engine.eos_prob == 0.0 and len(notes) == 3
    a, b = same.ops[1], same.ops[2]
    assert isinstance(a, Submit) and not a.return_logprob and a.input_ids == [256, 5, 6]
    assert isinstance(b, Submit) and b.input_ids == [7]
    assert equalized(Trace(ops=[Step()]))[1] == ()


# ---- the command ----


def result(divergence=None, error=None, unsupported=()) -> LockstepResult:
    hits = (GapHit("drain.idle_probe", "why", 1, "the drain"),)
    return LockstepResult("t", "0.5.23", 12, divergence, hits, (), 0.5, error, unsupported)


def test_the_exit_code_says_agree_diverge_or_cannot_run(capsys):
    """0: agree up to declared gaps; 1: a divergence (printed with both sides) or an error;
    2: a trace the real scheduler cannot express."""
    assert print_lockstep(result()) == 0
    assert "agree up to 1 declared gaps" in capsys.readouterr().out
    diverged = Divergence(3, "step", "", ("mode",), it(4, decode("r1")), None)
    assert print_lockstep(result(diverged)) == 1
    out = capsys.readouterr().out
    assert "first divergence in op #3" in out and "sglang: no iteration" in out
    assert print_lockstep(result(error="sglang: crash")) == 1
    assert print_lockstep(result(unsupported=("swa_tokens",))) == 2


def test_a_missing_sglang_interpreter_is_one_line_and_exit_2(tmp_path, capsys):
    """No sglang venv at the interpreter named: one line, exit 2, no traceback."""
    missing = tmp_path / "python"
    args = ["sglang", "lockstep", str(SPECS / "radix-eviction.yaml"), "--target-python"]
    with pytest.raises(SystemExit) as exited:
        main([*args, str(missing)])
    printed = capsys.readouterr().err
    assert exited.value.code == 2 and printed.count("\n") == 1
    assert "no sglang interpreter" in printed


def test_a_spec_the_real_scheduler_cannot_express_exits_2_before_any_driver():
    """A trace with SWA pools (the target drives them; lockstep's pairing of them with
    kvspec's engine was never read), or speculative decoding (whose verify batches lockstep
    does not read yet), is said unsupported, with the reason, before SGLang starts."""
    for name in ("swa-hybrid.yaml", "eagle-v1-paged.yaml"):
        outcome = lockstep_spec(load_spec(SPECS / name), python="/nonexistent/python")
        assert outcome.unsupported and print_lockstep(outcome) == 2


# ---- on real SGLang 0.5.23 ----


def small_trace(overlap: bool) -> Trace:
    """Four requests that never fill the batch: every decision is the same on both."""
    submits = [
        Submit(rid=f"r{i}", input_ids=list(range(3, 3 + 40 + 8 * i)), max_new_tokens=4 + i)
        for i in range(4)
    ]
    engine = EngineSpec(page_size=4, max_total_tokens=2048, max_num_reqs=8, enable_overlap=overlap)
    return Trace(name="small", engine=engine, ops=[submits[0], submits[1], Step(), *submits[2:]])


@pytest.mark.sglang
def test_a_small_trace_agrees_on_0_5_23_up_to_declared_gaps(latest):
    """Without overlap the two schedulers run the same batches and buckets; with overlap
    they do up to 0.5.23's skipped last decodes and the last token kvspec caches."""
    plain = lockstep_trace(small_trace(False), driver=latest)
    assert plain.ok and plain.iterations > 4, plain.divergence
    overlap = lockstep_trace(small_trace(True), driver=latest)
    assert overlap.ok, overlap.divergence
    assert {"overlap.skip_finishing_decode"} <= {hit.gap for hit in overlap.gaps}


@pytest.mark.sglang
def test_matrix_base_diverges_on_0_5_23_where_a_full_batch_refills(latest):
    """matrix-base on 0.5.23: iteration 24, SGLang prefills r12 and r13 where kvspec decodes,
    a full batch refilled the iteration after r0 and r8 finished (0.5.23 filters the running
    batch every iteration; kvspec follows 0.5.11)."""
    outcome = lockstep_spec(load_spec(SPECS / "matrix-base.yaml"), driver=latest)
    found = outcome.divergence
    assert found is not None and found.kvspec is not None and found.sglang is not None
    assert found.kvspec.number == 24 and found.kvspec.batch.mode == "decode"
    assert found.sglang.batch.mode == "extend" and found.sglang.batch.rids == {"r12", "r13"}
    assert [gid for gid, _ in found.likely] == ["sched.running_batch_filtered_each_iteration"]
