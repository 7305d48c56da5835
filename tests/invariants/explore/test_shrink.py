"""Shrinking (invariants/explore/ddmin.py): ddmin returns a 1-minimal failing subsequence,
every accepted candidate really fails, the search is deterministic and stays within its
budget of predicate runs, and the argument pass makes prompts and step counts smaller."""

from __future__ import annotations

from invariants.explore import shrink
from invariants.explore.ddmin import ddmin, simpler
from invariants.scenarios.ops import Abort, FlushCache, Op, Step, Submit, Trace


def noise(n: int) -> list[Op]:
    """``n`` ops that never matter to the predicates below."""
    return [FlushCache() if i % 2 else Step(n=3) for i in range(n)]


def culprit_trace() -> Trace:
    """Two culprit ops (a long submit, then its abort) buried in 60 unrelated ops."""
    ops = [
        *noise(25),
        Submit(rid="x", input_ids=list(range(40)), max_new_tokens=30),
        *noise(20),
        Abort(rid="x"),
        *noise(15),
    ]
    return Trace(name="t", ops=ops)


def submit_then_abort(trace: Trace) -> bool:
    """The synthetic bug: an abort of ``x`` after a submit of ``x`` with >= 5 prompt tokens."""
    seen = False
    for op in trace.ops:
        if isinstance(op, Submit) and op.rid == "x" and len(op.input_ids) >= 5:
            seen = True
        elif isinstance(op, Abort) and op.rid == "x" and seen:
            return True
    return False


def test_ddmin_finds_the_two_culprits_and_shortens_the_prompt() -> None:
    """60+ ops shrink to exactly [submit x, abort x]; the prompt to the 5 tokens the bug
    needs, max_new_tokens to 1; the result still fails."""
    small = shrink(culprit_trace(), submit_then_abort)
    assert [op.op for op in small.ops] == ["submit", "abort"]
    submit = small.ops[0]
    assert isinstance(submit, Submit) and len(submit.input_ids) == 5 and submit.max_new_tokens == 1
    assert submit_then_abort(small)


def test_shrink_is_deterministic() -> None:
    """The same trace and predicate shrink to the same trace."""
    assert shrink(culprit_trace(), submit_then_abort) == shrink(culprit_trace(), submit_then_abort)


def test_shrink_respects_its_budget() -> None:
    """At most ``budget`` predicate runs; with too few runs the result is still a failing
    trace (possibly not minimal)."""
    runs = []

    def counted(trace: Trace) -> bool:
        runs.append(1)
        return submit_then_abort(trace)

    small = shrink(culprit_trace(), counted, budget=7)
    assert len(runs) <= 7
    assert submit_then_abort(small) and len(small.ops) <= len(culprit_trace().ops)


def test_shrink_keeps_a_trace_nothing_smaller_reproduces() -> None:
    """When every op is needed, the ops come back unchanged."""
    ops: list[Op] = [Step(n=1), FlushCache(), Step(n=1)]
    trace = Trace(name="t", ops=ops)
    assert shrink(trace, lambda t: t.ops == ops).ops == ops


def test_ddmin_is_one_minimal() -> None:
    """Removing any single op of ddmin's result makes the predicate pass."""
    ops = culprit_trace().ops
    result = ddmin(list(ops), lambda o: submit_then_abort(Trace(ops=o)))
    assert all(
        not submit_then_abort(Trace(ops=result[:i] + result[i + 1 :])) for i in range(len(result))
    )


def test_simpler_candidates_are_smaller() -> None:
    """Candidates of a step are fewer steps, of a submit shorter prompts / fewer new tokens;
    ops without a size have none."""
    assert [op.n for op in simpler(Step(n=16))] == [1, 4, 8, 15]
    sub = Submit(rid="a", input_ids=[1] * 8, max_new_tokens=2, return_logprob=True)
    assert all(
        len(c.input_ids) < 8 or c.max_new_tokens < 2 or not c.return_logprob for c in simpler(sub)
    )
    assert simpler(FlushCache()) == [] and simpler(Step(n=1)) == []
