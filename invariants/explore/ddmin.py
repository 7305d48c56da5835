"""Shrinking a failing trace: delta debugging over its ops, then simpler ops.

Keeps: the result still fails the caller's predicate (every accepted candidate was run and
failed), the search is deterministic (no randomness: the same trace and predicate shrink to
the same result), and it costs at most ``budget`` predicate runs. Ops are intents, so every
candidate subsequence is a valid trace (invariants/scenarios/ops.py).

    1. ddmin (Zeller & Hildebrandt 2002) over the op list: drop chunks, then complements,
       at doubling granularity, until no single op can be removed (1-minimal)
    2. per op, simpler arguments: shorter prompts, fewer new tokens, fewer steps in
       ``step {n}``; each accepted only if the trace still fails (wait and idle budgets
       stay: a shorter one would fake a liveness finding)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from invariants.scenarios.ops import Op, Step, Submit, Trace

Predicate = Callable[[Trace], bool]
SHRINK_BUDGET = 600


class _Budget:
    """The predicate, counted: past ``limit`` runs every candidate is refused."""

    __slots__ = ("fails", "limit", "runs", "trace")

    def __init__(self, trace: Trace, fails: Predicate, limit: int) -> None:
        self.trace, self.fails, self.limit, self.runs = trace, fails, limit, 0

    def __call__(self, ops: list[Op]) -> bool:
        if self.runs >= self.limit:
            return False
        self.runs += 1
        return self.fails(self.trace.with_ops(ops))


def shrink(trace: Trace, fails: Predicate, *, budget: int = SHRINK_BUDGET) -> Trace:
    """A smaller trace that still ``fails`` (``trace`` itself if nothing smaller does);
    ``fails`` should match the original failure (e.g. the same invariant id), so that
    shrinking does not slide to a different bug."""
    return shrink_counted(trace, fails, budget=budget)[0]


def shrink_counted(
    trace: Trace, fails: Predicate, *, budget: int = SHRINK_BUDGET
) -> tuple[Trace, int]:
    """`shrink`, with the number of predicate runs it spent (at most ``budget``)."""
    test = _Budget(trace, fails, budget)
    ops = ddmin(list(trace.ops), test)
    ops = simplify(ops, test)
    return trace.with_ops(ddmin(ops, test)), test.runs


def ddmin(ops: list[Op], test: Callable[[list[Op]], bool]) -> list[Op]:
    """The classic ddmin: a 1-minimal failing subsequence of ``ops`` (within the budget)."""
    n = 2
    while len(ops) >= 2:
        chunks = _split(ops, n)
        smaller = next((c for c in chunks if test(c)), None)
        if smaller is not None:
            ops, n = smaller, 2
            continue
        rest = next((r for r in _complements(chunks) if test(r)), None) if n > 2 else None
        if rest is not None:
            ops, n = rest, max(n - 1, 2)
            continue
        if n >= len(ops):
            break
        n = min(2 * n, len(ops))
    if len(ops) == 1 and test([]):
        return []
    return ops


def _split(ops: list[Op], n: int) -> list[list[Op]]:
    size, extra = divmod(len(ops), n)
    chunks, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        chunks.append(ops[start:end])
        start = end
    return [c for c in chunks if c]


def _complements(chunks: list[list[Op]]) -> Iterator[list[Op]]:
    for i in range(len(chunks)):
        yield [op for j, chunk in enumerate(chunks) if j != i for op in chunk]


def simplify(ops: list[Op], test: Callable[[list[Op]], bool]) -> list[Op]:
    """Per op, the simplest candidate argument that still fails, until nothing changes."""
    changed = True
    while changed:
        changed = False
        for i in range(len(ops)):
            for candidate in simpler(ops[i]):
                trial = [*ops[:i], candidate, *ops[i + 1 :]]
                if test(trial):
                    ops, changed = trial, True
                    break
    return ops


def simpler(op: Op) -> list[Op]:
    """Simpler versions of ``op``, simplest first (empty: nothing to simplify)."""
    if isinstance(op, Submit):
        shorter = [op.input_ids[:k] for k in _smaller(len(op.input_ids))]
        fewer = _smaller(op.max_new_tokens)
        return (
            list[Op]()
            + [op.model_copy(update={"input_ids": ids}) for ids in shorter]
            + [op.model_copy(update={"max_new_tokens": m}) for m in fewer]
            + ([op.model_copy(update={"return_logprob": False})] if op.return_logprob else [])
        )
    if isinstance(op, Step):
        return [Step(n=k) for k in _smaller(op.n)]
    return []


def _smaller(value: int) -> list[int]:
    """Candidates for a positive count, smallest first: 1, a quarter, a half, one less."""
    return sorted({k for k in (1, value // 4, value // 2, value - 1) if 1 <= k < value})
