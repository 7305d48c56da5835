"""The checker's fast path (invariants/checking/fastpath.py) changes no result: on every catalog
fixture and on random engine runs broken on purpose, a checker with it records exactly the
violations of one without it; on a clean run it is the path actually taken; and the node tuples
it relies on are their prior tuple minus ``gone`` plus ``fresh``; node sets kept by a
``TermMemo`` equal their comprehensions."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.mem.feed import ChangedTuple
from engine.request import SamplingParams
from engine.view import StateView
from engine.view_blocks import BlockView
from invariants.checking.checker import Checker, CheckerHook, Level
from invariants.checking.dsl import make_env
from invariants.checking.loader import load_catalog
from invariants.checking.memos import TermMemo, node_memo
from tests.engine.observe.census_ops import OPS, apply_op

CATALOG = load_catalog()


def _records(checker: Checker) -> list[tuple[str, str, int, str, tuple[str, ...], int]]:
    return [
        (v.invariant, v.event, v.step, v.kind, v.witnesses, v.num_failing)
        for v in checker.violations
    ]


@pytest.mark.parametrize("rule", CATALOG.rules, ids=lambda r: r.id)
def test_fixtures_give_the_same_violations_with_and_without_fast_path(rule) -> None:
    """Each rule's pass and fail fixtures, checked with and without the fast path, twice
    in a row (the second time the memos hold): the same records."""
    for fixture in rule.fixtures.values():
        fast, slow = Checker([rule], Level.RECORD), Checker([rule], Level.RECORD, fast_path=False)
        for checker in (fast, slow):
            for _ in range(2 + rule.for_steps):
                checker.prev = fixture.prev
                checker.check(fixture.event, fixture.view)
        assert _records(fast) == _records(slow)


def _lock_one_node(engine: Engine, pick: int) -> None:
    """A lock taken on one node but not on its parent, the cache's sizes kept in step: only
    tree.locked_ancestors (a per-node rule) can see it."""
    cache = engine.mem.tree_cache
    registry = cache.node_registry()
    nodes = [
        n
        for n in registry.all()[1:]
        if n.lock_ref == 0 and n.parent is not registry.root and n.parent.lock_ref == 0
    ]
    if nodes:
        node = nodes[pick % len(nodes)]
        node.lock_ref += 1
        cache.evictable_size_ -= len(node.key)
        cache.protected_size_ += len(node.key)
        registry.relock([node])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([1, 4]),
    st.lists(
        st.one_of(OPS, st.tuples(st.just("lock_one"), st.integers(0, 30))), min_size=1, max_size=20
    ),
)
def test_broken_runs_give_the_same_violations(page_size: int, ops: list[tuple]) -> None:
    """Two recording checkers on one engine — fast path on and off — see the same events
    of a run with double frees, leaks, freed and leaked tree nodes, half-locked paths: the
    same records."""
    memory = MemoryConfig(
        page_size=page_size, max_total_tokens=256, max_num_reqs=8, context_len=128, strict=False
    )
    fast, slow = Checker(CATALOG, Level.RECORD), Checker(CATALOG, Level.RECORD, fast_path=False)
    engine = Engine(
        EngineConfig(memory=memory, enable_overlap=False),
        observers=[CheckerHook(fast), CheckerHook(slow)],
    )
    rids: list[str] = []
    for op in ops:
        try:
            _lock_one_node(engine, op[1]) if op[0] == "lock_one" else apply_op(engine, op, rids)
        except Exception:  # a broken state may stop the engine itself; the records stand
            break
    assert _records(fast) == _records(slow)


def test_a_clean_run_takes_the_fast_path() -> None:
    """On a clean run every checked event passes through the fused test (none falls back),
    and the stats still count one evaluation per rule and event."""
    checker = Checker(CATALOG, Level.STRICT)
    engine = Engine(
        EngineConfig(memory=MemoryConfig(max_total_tokens=512)), observers=[CheckerHook(checker)]
    )
    engine.generate([[5] * 40, [6] * 30, [5] * 20 + [7] * 9])
    step, idle = checker._fast["step"], checker._fast["idle"]
    assert step.passes == engine.step_count and idle.passes >= 1 and checker.violations == []
    # tree.page_aligned listens at step and idle
    assert checker.stats()["tree.page_aligned"].evaluations == step.passes + idle.passes


def test_a_half_locked_path_is_seen_after_an_incremental_step() -> None:
    """A node locked without its parent after the node memos hold: the fast path (over the
    fresh views only) does not pass it, and the violation is the one a full check finds."""
    fast, slow = Checker(CATALOG, Level.RECORD), Checker(CATALOG, Level.RECORD, fast_path=False)
    engine = Engine(
        EngineConfig(memory=MemoryConfig(max_total_tokens=512), enable_overlap=False),
        observers=[CheckerHook(fast), CheckerHook(slow)],
    )
    engine.generate([[5] * 20 + [6] * 10, [5] * 20 + [7] * 10])
    assert fast.violations == []
    _lock_one_node(engine, 0)
    engine.submit([9] * 5, SamplingParams(max_new_tokens=2, ignore_eos=True))
    engine.step()
    assert "tree.locked_ancestors" in {v.invariant for v in fast.violations}
    assert _records(fast) == _records(slow)


def test_node_tuples_are_prior_minus_gone_plus_fresh() -> None:
    """Between two hand-outs the registry's tuple changes by exactly its gone and fresh views."""
    engine = Engine(EngineConfig(memory=MemoryConfig(max_total_tokens=512)))
    registry = engine.mem.tree_cache.node_registry()
    before = registry.views()
    for prompt in ([5] * 40, [5] * 20 + [6] * 10, [7] * 12):
        engine.submit(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True))
        for _ in range(4):
            engine.step()
            after = registry.views()
            if after is not before:
                assert after.prior is before
                expected = (
                    Counter(map(id, before))
                    - Counter(map(id, after.gone))
                    + Counter(map(id, after.fresh))
                )
                assert expected == Counter(map(id, after))
            before = after


def test_node_sets_are_kept_by_set_memos() -> None:
    """tree.locked_ancestors' two node sets are kept by set TermMemos at ``step``, and each memo's
    set equals its comprehension over every tuple the registry hands out."""
    checker = Checker(CATALOG, Level.STRICT)
    memos = [m for m in checker._fast["step"].sums if isinstance(m, TermMemo) and m.is_set]
    assert len(memos) >= 2
    engine = Engine(EngineConfig(memory=MemoryConfig(max_total_tokens=512), enable_overlap=False))
    for prompt in ([5] * 40, [5] * 20 + [6] * 10, [7] * 12, [5] * 20 + [8] * 6):
        engine.submit(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True))
        for _ in range(3):
            engine.step()
            env = make_env(engine.state_view(), None)
            for memo in memos:
                assert memo.value(env) == set(
                    eval(memo.elements, env)
                )  # the memo's own compiled comprehension
    assert any(memo.value(env) for memo in memos)


def test_checkers_of_the_same_rules_share_code_not_memory() -> None:
    """A checker's fast paths are compiled once per rule objects and event, but each
    checker's memos start empty: what one checker saw never vouches for another's views."""
    first = Checker(CATALOG, Level.STRICT)
    engine = Engine(
        EngineConfig(memory=MemoryConfig(max_total_tokens=512)), observers=[CheckerHook(first)]
    )
    engine.generate([[5] * 40, [6] * 30])
    second = Checker(CATALOG, Level.STRICT)
    used, fresh = first._fast["step"], second._fast["step"]
    assert fresh.fused is used.fused and fresh.memos.keys() == used.memos.keys()
    assert any(m.seen is not None for m in used.memos.values())
    assert all(m.seen is None and not m.passed for m in fresh.memos.values())
    assert all(m.seen is None for m in fresh.sums) and fresh.passes == 0


def test_a_rule_with_a_constant_display_is_decided_over_the_fresh_blocks_only() -> None:
    """A display of constants in a rule (``()`` in ``vllm.cached_hash_maps_to_its_block``) is
    the same at every event, not a context value (a list could not be compared as one): the
    rule's memo still decides a view from its fresh blocks — a fresh failing block fails it,
    and an unchanged block is not looked at again."""
    rule = next(r for r in CATALOG.rules if r.id == "vllm.cached_hash_maps_to_its_block")
    memo = node_memo(rule)
    assert memo is not None
    cached = BlockView(1, ref_cnt=1, holders=1, hash="h1", mapped_as=("h1",))
    first = ChangedTuple.of([cached], None, (cached,), ())
    assert memo.passes(make_env(StateView(event="step", blocks=first)))
    assert memo.values is not None  # the context was compared, so the memo holds
    stale = BlockView(2, in_free_queue=True, mapped_as=("h2",))  # listed under a hash it lost
    second = ChangedTuple.of([cached, stale], first, (stale,), ())
    assert not memo.passes(make_env(StateView(event="step", blocks=second)))
    fixed = BlockView(2, in_free_queue=True)
    third = ChangedTuple.of([cached, fixed], None, (fixed,), ())
    assert memo.passes(make_env(StateView(event="step", blocks=third)))  # a full evaluation
    fourth = ChangedTuple.of([cached, fixed], third, (), ())
    env = make_env(StateView(event="step", blocks=fourth))
    assert memo.passes(env) and memo.seen is fourth


def test_a_block_rule_keeps_one_memo_across_its_events() -> None:
    """A rule checked at step and at idle keeps one memo: an idle view after a passing step
    view is decided from the records changed since — a changed record failing the rule is
    found, an unchanged one is not looked at again (here one that breaks the tuple's promise
    that it is the very record the step view passed)."""
    rule = next(r for r in CATALOG.rules if r.id == "vllm.ref_cnt_is_holders")
    checker = Checker([rule], Level.RECORD)
    assert checker._fast["step"].memos[rule.id] is checker._fast["idle"].memos[rule.id]
    held = BlockView(1, ref_cnt=1, holders=1)
    first = ChangedTuple.of([held], None, (held,), ())
    assert checker.check("step", StateView(event="step", blocks=first)) == ()
    unseen = ChangedTuple.of([BlockView(1, ref_cnt=5, holders=1)], first, (), ())
    assert checker.check("idle", StateView(event="idle", blocks=unseen)) == ()
    double = BlockView(2, ref_cnt=2, holders=1)
    third = ChangedTuple.of([held, double], unseen, (double,), ())
    (found,) = checker.check("idle", StateView(event="idle", blocks=third))
    assert found.invariant == rule.id and "block 2" in found.message
