"""Regression tests for the streaming-session match and accounting bugs of docs/sglang.md
§5 (#20070, #20476, #22213/#22753, #22862 — both sources), named after the behaviour (the
abort and finish paths: test_session_abort_regressions.py). Where the bug can be planted,
a monkeypatch mutant brings it back for one test, and the checker over the shipped catalog
stops the engine at the first event that shows it, naming the invariant.
The same scenario on the correct engine violates nothing (the finding is the mutant's).
Checker bugs (#20070's idle formula, #22213's double count) are shown the other way round:
the old formula fires on the correct engine, the shipped rule does not."""

from __future__ import annotations

from dataclasses import replace

import pytest
from session_mutants import RETRY, TEXTS, first_violations, three_turns
from session_support import CATALOG, checked_engine, encode, session_config, sp, turn

from engine.cache.streaming_session import SessionSlot
from engine.engine import Engine
from engine.request import Req
from invariants.checking.checker import Checker, CheckerHook, Level
from invariants.checking.loader import load_text
from invariants.mutants import mutant

# ---- #20070: cache_protected_len page alignment ----


def test_later_turns_keep_the_turn1_page_aligned_protected_prefix() -> None:
    """#20070: a restored turn's cache_protected_len is the slot's page-aligned turn-1 prefix,
    not len(prefix_indices). Mutant (the old match result, no cache_protected_len):
    req.cache_protected_page_aligned fires on turn 2 (page 4, SWA radix)."""
    assert first_violations(three_turns, page_size=4, cache="swa") == {}
    with mutant("20070-unaligned-protected").patch():
        found = first_violations(three_turns, page_size=4, cache="swa")
    assert "req.cache_protected_page_aligned" in found and found["pool.busy_sum"].event == "step"


def test_idle_checks_count_session_held_kv_and_turn1_locks() -> None:
    """#20070's idle half: SGLang's old hybrid idle check ignored session-held KV and the
    turn-1 lock. Those formulas fire at idle on the correct engine with an open session;
    the shipped pool.idle_sum and tree.idle_unlocked do not."""
    old = load_text("""
version: 1
invariants:
  - {id: old.idle_sum, title: old idle sum, when: [idle], for_each: pools as p,
     expr: p.free + p.evictable + p.protected == p.capacity, message: "{p.name}",
     fixtures: {pass: {event: idle, view: {}}, fail: {event: idle, view: {}}}}
  - {id: old.idle_unlocked, title: old idle locks, when: [idle], for_each: tree.nodes as n,
     where: not n.is_root, expr: n.lock_ref == 0, message: "{n.id}",
     fixtures: {pass: {event: idle, view: {}}, fail: {event: idle, view: {}}}}
""")
    old_checker = Checker(old, Level.RECORD)
    engine = Engine(
        session_config(4, cache="swa"),
        observers=[CheckerHook(old_checker), CheckerHook(Checker(CATALOG, Level.STRICT))],
    )
    sid = engine.open_session(1000, streaming=True)
    turn(engine, sid, encode(TEXTS[0]), 8)
    assert {v.invariant for v in old_checker.violations} == {"old.idle_sum", "old.idle_unlocked"}
    engine.close_session(sid)


# ---- #20476: chunked prefill + streaming, non-destructive restore ----


def rejected_then_retried(engine: Engine) -> None:
    """Turn 2 is restored in the same round as a plain request that spends the round's
    prefill budget (max_prefill_tokens): the adder turns it away, the next round restores it
    again and admits it."""
    sid = engine.open_session(1000, streaming=True)
    turn(engine, sid, encode(TEXTS[0]), 8)
    engine.submit(list(range(1, 61)), sp(8))
    rid = engine.submit(encode(TEXTS[1]), sp(8), session_params={"id": sid})
    engine.run_until_idle()
    assert engine.pop_result(rid).cached_tokens > 0
    engine.close_session(sid)


def test_restored_turn_rejected_by_the_adder_retries_without_a_tree_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#20476: a restored turn that the prefill adder rejects is restored again next round —
    the slot keeps its row, and no real tree lock is taken. Mutant (the destructive restore,
    clearing the slot's row): the retry falls through to the radix match; the waiting request
    then holds a row outside SGLang's busy set (sched.busy_set_covers_live)."""
    restores: list[int] = []
    real_restore = SessionSlot.restore_to_req

    def counting(self: SessionSlot, req: Req) -> None:
        restores.append(self.req_pool_idx or -1)
        real_restore(self, req)

    monkeypatch.setattr(SessionSlot, "restore_to_req", counting)
    assert first_violations(rejected_then_retried, **RETRY) == {}
    assert len(restores) == 2 and len(set(restores)) == 1

    with mutant("20476-destructive-restore").patch():
        found = first_violations(rejected_then_retried, **RETRY)
    assert "sched.busy_set_covers_live" in found


# ---- #22213 / #22753: borrowed slots counted once ----


def test_busy_check_counts_a_borrowed_slot_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """#22213: while a turn borrows the slot's row, its KV is the request's (uncached), not
    also session-held. The shipped sums hold on every turn (no false positive); the old
    formula (every slot held, borrowed or not) double counts: pool.busy_sum fires on turn 2."""
    assert first_violations(three_turns, page_size=4, retract=True) == {}
    monkeypatch.setattr(SessionSlot, "row_owner", lambda self: None)  # every slot held
    found = first_violations(three_turns, page_size=4)
    assert found["pool.busy_sum"].event == "step"


# ---- #22862: the stale tail, both sources ----


def over_allocated_slot(engine: Engine) -> None:
    """Turn 1 leaves a slot with allocated > committed (a speculative tail, planted: eight
    slots past committed), then turn 2 restores it."""
    sid = engine.open_session(1000, streaming=True)
    turn(engine, sid, encode(TEXTS[0]), 9)
    slot = engine.mem.tree_cache.slots[sid]
    extra = engine.mem.allocator.alloc(8)
    start = -(-slot.kv_committed_len // 4) * 4
    engine.mem.req_to_token_pool.write(slot.req_pool_idx, start, extra)
    slot.kv_allocated_len = start + 8
    turn(engine, sid, encode(TEXTS[1]), 8)
    engine.close_session(sid)


def one_token_turn(engine: Engine) -> None:
    """Turn 2 appends a single token (no BOS): with overlap its key is exactly turn 1's
    committed KV, where the old formula reserved the logit token a second time."""
    sid = engine.open_session(1000, streaming=True)
    turn(engine, sid, encode(TEXTS[0]), 8)
    turn(engine, sid, [42], 8)
    turn(engine, sid, [43], 8)
    engine.close_session(sid)


def test_restore_frees_the_stale_tail_of_an_over_allocated_slot() -> None:
    """#22862, over-allocation source: the restore frees ``[ceil(prefix_len), allocated)``
    before the extend overwrites the row. Mutant (no _free_tail): the overwritten slots leak —
    pool.busy_sum fires at the end of the resuming prefill iteration."""
    assert first_violations(over_allocated_slot, page_size=4, overlap=False) == {}
    with mutant("22862-stale-tail-leak").patch():
        found = first_violations(over_allocated_slot, page_size=4, overlap=False)
    assert found["pool.busy_sum"].event == "step"


def test_prefix_len_keeps_a_single_logit_reserve() -> None:
    """#22862, formula source: ``prefix_len = min(committed, len(key))`` (the key already
    drops the logit token). Mutant (the old ``len(key) - 1`` and no tail free): a one-token
    turn under overlap overwrites the last committed slot, which leaks — pool.busy_sum."""
    assert first_violations(one_token_turn, page_size=1, overlap=True) == {}
    with mutant("22862-double-logit-reserve").patch():
        found = first_violations(one_token_turn, page_size=1, overlap=True)
    assert found["pool.busy_sum"].event == "step"


def test_freeing_session_memory_with_nothing_running_unblocks_admission() -> None:
    """Rule (liveness): a 'batch is full' verdict is stale once nothing runs. When a streaming
    slot pins the memory, admission answers NO_TOKEN and marks the running batch full; a
    close (or abort, or flush) that frees that memory with no request running must let the
    waiting request in — else the scheduler stalls with every page free (found by
    `kvspec explore`; SGLang carries the same reset as a "HACK … otherwise it hangs")."""
    config = replace(
        session_config(page_size=16, overlap=False, total=256, context_len=200),
        chunked_prefill_size=None,
    )
    engine, checker = checked_engine(config)
    sid = engine.open_session(256, "s", streaming=True)
    first = engine.submit(list(range(1, 82)), sp(1), session_params={"id": sid})
    engine.run_until_idle()
    engine.pop_result(first)
    plain = engine.submit(list(range(1, 141)), sp(4))  # does not fit beside the slot
    engine.step()
    engine.step()
    engine.close_session(sid)
    engine.run_until_idle(max_steps=50)
    assert engine.pop_result(plain).meta_info()["finish_reason"]["type"] == "length"
    assert not checker.violations
