"""Seeded exploration of the memory layer: the anchor step loop driven through KVMemory.

Keeps: determinism — every choice (trace, retract victims) comes from the seed, so a
violation replays with the command the report prints. The loop is the anchor benchmark's
(admit → one extend → one decode round → release finished), plus optional seeded retracts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.mem import paging
from engine.memory import KVMemory
from engine.request import Req
from invariants.scenarios.workload import TraceRequest

Observer = Callable[[str, int, list[Req]], None]  # (event, step, live requests)


@dataclass(slots=True)
class ExerciseStats:
    """What one exercise did (each counter > 0 proves that path ran)."""

    steps: int = 0
    admitted: int = 0
    finished: int = 0
    retracted: int = 0
    prefix_hit_tokens: int = 0
    extend_tokens: int = 0
    decode_tokens: int = 0


@dataclass(slots=True, eq=False)
class MemoryExercise:
    """Runs a trace through ``mem`` with at most ``batch`` running requests."""

    mem: KVMemory
    trace: list[TraceRequest]
    batch: int
    seed: int = 0
    retract_prob: float = 0.0
    max_prefill_tokens: int = 16384
    observe: Observer | None = None
    stats: ExerciseStats = field(default_factory=ExerciseStats)
    _rng: np.random.Generator = field(init=False)
    _plan: dict[str, TraceRequest] = field(init=False)
    _waiting: list[Req] = field(init=False)  # FCFS: pop() from the end
    _running: list[Req] = field(init=False)
    _reserve: int = field(init=False)  # decode tokens still owed to running requests

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng([self.seed, 1])  # the retract sub-stream
        self._plan = {t.rid: t for t in self.trace}
        self._waiting = [Req(t.rid, list(t.input_ids)) for t in reversed(self.trace)]
        self._running = []
        self._reserve = 0

    @property
    def has_waiting(self) -> bool:
        return bool(self._waiting)

    @property
    def done(self) -> bool:
        return not self._waiting and not self._running

    @property
    def running(self) -> list[Req]:
        return list(self._running)

    def run(self) -> ExerciseStats:
        while not self.done:
            self.step()
        if self.observe:
            self.observe("idle", self.stats.steps, [])
        return self.stats

    def step(self) -> None:
        new = self._admit()
        if new:
            self._prefill(new)
        if self._running:
            self._decode()
        self.stats.steps += 1
        if self.observe:
            self.observe("step", self.stats.steps, list(self._running))

    def _owed(self, req: Req) -> int:
        return (
            paging.ceil_align(self._plan[req.rid].max_new_tokens, self.mem.page_size)
            + self.mem.page_size
        )

    def _admit(self) -> list[Req]:
        """FCFS admission under a prefill budget and a memory gate (PrefillAdder stand-in)."""
        new: list[Req] = []
        budget = self.max_prefill_tokens
        room = self.mem.admittable_size() - self._reserve
        while self._waiting and len(self._running) + len(new) < self.batch:
            req = self._waiting[-1]
            req.fill_ids = req.origin_input_ids + req.output_ids
            self.mem.match_prefix(req)
            extend = len(req.fill_ids) - len(req.prefix_indices)
            need = paging.ceil_align(extend, self.mem.page_size) + self._owed(req)
            if need > room or (new and extend > budget):
                if not new and not self._running:
                    raise RuntimeError(f"pool too small for request {req.rid} ({need} tokens)")
                break
            self._waiting.pop()
            self.mem.lock(req)
            new.append(req)
            budget, room, self._reserve = (
                budget - extend,
                room - need,
                self._reserve + self._owed(req),
            )
        return new

    def _prefill(self, new: list[Req]) -> None:
        self.mem.alloc_for_extend(new)
        for req in new:
            self.stats.prefix_hit_tokens += len(req.prefix_indices)
            self.stats.extend_tokens += len(req.fill_ids) - len(req.prefix_indices)
            if self._sample(req):
                self._release(req, finished=True)
            else:
                self.mem.checkpoint(req)
                self._running.append(req)
        self.stats.admitted += len(new)

    def _decode(self) -> None:
        self.mem.alloc_for_decode(self._running)
        self.stats.decode_tokens += len(self._running)
        still = []
        for req in self._running:
            self.mem.evict_swa(req)
            if self._sample(req):
                self._release(req, finished=True)
            elif self.retract_prob and self._rng.random() < self.retract_prob:
                self._release(req, finished=False)
            else:
                still.append(req)
        self._running = still

    def _sample(self, req: Req) -> bool:
        """Append the planned next token; True when the request reached its length."""
        plan = self._plan[req.rid]
        req.output_ids.append(plan.output_ids[len(req.output_ids)])
        return len(req.output_ids) >= plan.max_new_tokens

    def _release(self, req: Req, finished: bool) -> None:
        """Finish (insert into the cache) or retract (free, re-queue at the front)."""
        self.mem.release_kv_cache(req, is_insert=finished)
        self._reserve -= self._owed(req)
        if finished:
            self.stats.finished += 1
            return
        self.stats.retracted += 1
        self._waiting.append(_reset_for_retract(req))


def _reset_for_retract(req: Req) -> Req:
    """A fresh request carrying the same tokens (SGLang's ``reset_for_retract``)."""
    return Req(req.rid, req.origin_input_ids, list(req.output_ids), extra_key=req.extra_key)
