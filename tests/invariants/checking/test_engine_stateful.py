"""Random traffic through the whole engine keeps every invariant of the catalog: requests are
submitted (short, longer than the chunk, over the context limit), aborted in every phase,
stepped, force-retracted and run to idle, on a configuration drawn per example (page size,
radix/chunk cache, overlap, mixed chunk, SWA pools, forced-retract interval). The YAML checker
runs at level 2 at every engine event through the step hook, so the first violation fails the
example with the invariant's id and message; teardown runs to idle and checks the idle event."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.request import Req, SamplingParams
from invariants.checking.checker import Checker, CheckerHook, Level
from invariants.checking.loader import load_catalog
from tests.engine.sched.sched_support import SteppingRules, driving

CATALOG = load_catalog()
TOTAL_TOKENS = 512  # a few long requests fill it: the cache evicts, decode retracts
CONTEXT_LEN = 192  # prompts of >= 186 tokens are rejected at submit (max_req_input_len)
SHARED = np.random.default_rng(0).integers(0, 256, 96).tolist()  # a common head: radix hits
PHASES = ("waiting", "running", "chunked", "any")
LENGTHS = st.one_of(st.integers(1, 40), st.integers(41, 185), st.integers(186, 240))
PROMPTS = st.tuples(LENGTHS, st.integers(0, 96), st.integers(0, 2**16), st.integers(1, 32))


class EventCounter:
    """An observer that counts the engine events (proves the idle check ran)."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    def on_event(self, event: str, engine: Any) -> None:
        self.seen[event] += 1


def make_prompt(length: int, shared: int, seed: int) -> list[int]:
    """``length`` tokens: the first ``min(shared, length)`` of the common head, then random."""
    head = SHARED[: min(shared, length)]
    return head + np.random.default_rng(seed).integers(0, 256, length - len(head)).tolist()


class EngineMachine(SteppingRules):
    """The engine under random traffic; every event is checked by the strict catalog."""

    @initialize(
        ps=st.sampled_from([1, 4, 16]),
        radix=st.booleans(),
        overlap=st.booleans(),
        mixed=st.booleans(),
        swa=st.booleans(),
        retract=st.booleans(),
        interval=st.integers(1, 4),
        chunk=st.sampled_from([16, 32, 64]),
        seed=st.integers(0, 3),
        first=st.lists(PROMPTS, min_size=2, max_size=8),
    )
    def setup(
        self,
        ps: int,
        radix: bool,
        overlap: bool,
        mixed: bool,
        swa: bool,
        retract: bool,
        interval: int,
        chunk: int,
        seed: int,
        first: list[tuple[int, int, int, int]],
    ) -> None:
        """The engine of this example, with a first wave of requests queued."""
        mem = MemoryConfig(
            page_size=ps,
            max_total_tokens=TOTAL_TOKENS,
            max_num_reqs=8,
            context_len=CONTEXT_LEN,
            cache="radix" if radix else "chunk",
            swa_tokens=TOTAL_TOKENS // 2 if swa else None,
            sliding_window=32 if swa else None,
        )
        config = EngineConfig(
            memory=mem,
            seed=seed,
            eos_prob=0.05,
            chunked_prefill_size=max(chunk, ps),
            enable_overlap=overlap,
            enable_mixed_chunk=mixed,
            test_retract=retract,
            test_retract_interval=interval,
        )
        self.checker = Checker(CATALOG, Level.STRICT)
        self.events = EventCounter()
        self.engine = Engine(config, observers=[CheckerHook(self.checker), self.events])
        self.rids: list[str] = []
        self.aborted: set[str] = set()
        self.broken = False
        for prompt in first:
            self.submit(*prompt)

    def _unfinished(self) -> int:
        return sum(not self.engine.requests[rid].finished() for rid in self.rids)

    @precondition(lambda self: self._unfinished() < 10)
    @rule(
        length=LENGTHS,
        shared=st.integers(0, 96),
        seed=st.integers(0, 2**16),
        max_new=st.integers(1, 32),
    )
    @driving
    def submit(self, length: int, shared: int, seed: int, max_new: int) -> None:
        """A prompt at or over the input limit finishes at once (aborted, status 400)."""
        rid = self.engine.submit(
            make_prompt(length, shared, seed), SamplingParams(max_new_tokens=max_new)
        )
        self.rids.append(rid)
        if length >= self.engine.config.max_req_input_len:
            result = self.engine.results[rid]
            assert result.finish_reason.kind == "abort" and result.finish_reason.status_code == 400

    @precondition(lambda self: self.rids)
    @rule(phase=st.sampled_from(PHASES), pick=st.integers(0, 63))
    @driving
    def abort(self, phase: str, pick: int) -> None:
        """Abort a request of one phase (or any submitted one): it is found exactly when it
        is known and not finished."""
        candidates = self._in_phase(phase)
        if not candidates:
            return
        req = candidates[pick % len(candidates)]
        unfinished = not req.finished()
        found = self.engine.abort(req.rid)
        assert found == unfinished
        if found:
            self.aborted.add(req.rid)

    def _in_phase(self, phase: str) -> list[Req]:
        sched = self.engine.scheduler
        if phase == "waiting":
            return list(sched.waiting_queue)
        if phase == "running":
            return list(sched.running_batch.reqs)
        if phase == "chunked":
            return [] if sched.chunked_req is None else [sched.chunked_req]
        return [self.engine.requests[rid] for rid in self.rids]

    @rule()
    @driving
    def run_until_idle(self) -> None:
        self.engine.run_until_idle()
        assert self.engine.is_idle()

    @invariant()
    def nothing_recorded(self) -> None:
        assert self.checker.violations == []

    def teardown(self) -> None:
        """Run to idle: the idle event is checked, every request has exactly one result, and
        an accepted abort ends its request as aborted."""
        if not hasattr(self, "engine") or self.broken:
            return
        idle_before = self.events.seen["idle"]
        self.engine.run_until_idle()
        assert self.events.seen["idle"] == idle_before + 1 and self.engine.is_idle()
        assert set(self.engine.results) == set(self.rids)
        assert all(self.engine.results[rid].finish_reason.kind == "abort" for rid in self.aborted)
        assert self.checker.stats()["pool.idle_sum"].evaluations > 0


TestEngineMachine = EngineMachine.TestCase
