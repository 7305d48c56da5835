"""One iteration of a scheduler as lockstep compares it — the batch it ran and the pool
buckets it left — read off kvspec's engine or off the real-scheduler driver's answer, and the
comparison of two such records.

Keeps: both sides are read the same way and at the same point (the end of the iteration,
after its results were processed): the batch is the one launched in the iteration (overlap:
the one whose forward was launched, not the one processed), each request with the tokens its
forward gives it (extend: the chunk, ``extend_input_len``; decode, and a mixed batch's
decoding requests: 1), plus the requests retracted in the iteration; the buckets are the full
pool's five counters as the views give them. Requests compare as sets (order within a batch
is not a scheduling decision the two designs share).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from engine.view import POOL_BUCKETS, SELECTIVE

POOL_PARTS = frozenset({SELECTIVE, "pools"})  # the state view's pools only: cheap
ASPECTS = ("mode", "requests", "tokens", "retracted", *POOL_BUCKETS)


class Batch(NamedTuple):
    """The batch of one iteration."""

    mode: str  # idle | extend | decode | mixed
    reqs: tuple[tuple[str, int], ...] = ()  # (rid, new tokens), in batch order
    retracted: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()  # finished in the iteration (shown and read by gaps only)

    def __str__(self) -> str:
        reqs = " ".join(f"{rid}+{n}" for rid, n in self.reqs)
        out = f" retracted [{' '.join(self.retracted)}]" if self.retracted else ""
        done = f" finished [{' '.join(self.finished)}]" if self.finished else ""
        return f"{self.mode}[{reqs}]{out}{done}"

    @property
    def rids(self) -> set[str]:
        return {rid for rid, _ in self.reqs}


class Iteration(NamedTuple):
    """One iteration of one side: its number there, its batch, the buckets it left."""

    number: int
    batch: Batch
    buckets: dict[str, int]

    def describe(self) -> str:
        pools = " ".join(f"{k}={v}" for k, v in self.buckets.items())
        return f"iteration {self.number}: {self.batch}; {pools}"


def kvspec_iteration(engine: Any) -> Iteration:
    """The iteration kvspec's engine just ended (read at its ``step`` event)."""
    sched = engine.scheduler
    released = sched.released
    retracted = tuple(r.rid for r in released if not r.is_insert and not r.finished)
    finished = tuple(r.rid for r in released if r.finished)
    batch, mode = sched.cur_batch, "idle"
    reqs: tuple[tuple[str, int], ...] = ()
    if batch is not None and batch.forward is not None:
        fb = batch.forward
        mode = batch.mode.value
        reqs = tuple((r.rid, int(n)) for r, n in zip(fb.reqs, fb.extend_lens.tolist()))
    pool = engine.state_view("step", POOL_PARTS).pools[0]
    buckets = {name: getattr(pool, name) for name in POOL_BUCKETS}
    return Iteration(engine.step_count, Batch(mode, reqs, retracted, finished), buckets)


def sglang_iteration(answer: dict[str, Any]) -> Iteration:
    """The iteration a driver's step answer reports (its ``batch`` and step view)."""
    raw, view = answer["batch"], answer["views"][0]
    reqs = tuple((rid, int(n)) for rid, n in raw["reqs"])
    batch = Batch(raw["mode"], reqs, tuple(raw["retracted"]), tuple(raw["finished"]))
    pool = view["pools"][0]
    return Iteration(int(view["step"]), batch, {name: pool[name] for name in POOL_BUCKETS})


class Recorder:
    """Observer on kvspec's engine: every iteration's record, in order."""

    def __init__(self) -> None:
        self.iterations: list[Iteration] = []

    def on_event(self, event: str, engine: Any) -> None:
        if event == "step":
            self.iterations.append(kvspec_iteration(engine))


def compare(ours: Iteration, theirs: Iteration) -> tuple[str, ...]:
    """The aspects in which two iterations differ (``ASPECTS`` order; empty: they agree).
    ``tokens``: the same requests, some given a different number of new tokens."""
    a, b = ours.batch, theirs.batch
    found = []
    if a.mode != b.mode:
        found.append("mode")
    if a.rids != b.rids:
        found.append("requests")
    elif dict(a.reqs) != dict(b.reqs):
        found.append("tokens")
    if set(a.retracted) != set(b.retracted):
        found.append("retracted")
    found += [name for name in POOL_BUCKETS if ours.buckets[name] != theirs.buckets[name]]
    return tuple(found)
