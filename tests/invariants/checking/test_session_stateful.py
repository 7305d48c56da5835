"""Random session traffic through the whole engine keeps every invariant of the catalog:
streaming and plain sessions are opened and closed (at once or deferred), turns appended
(streaming: with and without a turn in flight, with rejected parameters; plain: rid, offset,
replace, drop_previous_output), over-long turns sent, plain requests mixed in, requests
aborted in every phase, retracts forced, the cache flushed, time advanced past session
timeouts — on a configuration drawn per example (page size, radix/chunk/SWA cache, overlap,
mixed chunk, forced retract). The checker runs the whole catalog (memory, scheduler,
session, response rules) at level 2 at every event, so the first violation fails the example
with the invariant's id; teardown closes every session, runs to idle and requires the pools
to be back to free + evictable."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.hooks import SimClock
from engine.model.tokenizer import BOS_ID
from engine.request import SamplingParams
from invariants.checking.checker import Checker, CheckerHook, Level
from invariants.checking.loader import load_catalog
from tests.engine.sched.sched_support import SteppingRules, driving

CATALOG = load_catalog()
CONTEXT_LEN = 384  # inputs of >= 378 tokens are too long (pre-abort, status 400)
MAX_SESSIONS = 4
PHASES = ("waiting", "running", "chunked", "any")
PARAMS = st.sampled_from(
    [
        {},
        {},
        {},
        {"offset": -1},
        {"offset": 2},
        {"replace": True},
        {"drop_previous_output": True},
        {"offset": -1, "replace": True},
    ]
)


def tokens(length: int, seed: int, bos: bool) -> list[int]:
    body = np.random.default_rng(seed).integers(0, 256, length).tolist()
    return ([BOS_ID] if bos else []) + body


class SessionMachine(SteppingRules):
    """Sessions under random traffic; every event is checked by the strict catalog."""

    @initialize(
        ps=st.sampled_from([1, 4, 16]),
        cache=st.sampled_from(["radix", "chunk", "swa"]),
        overlap=st.booleans(),
        mixed=st.booleans(),
        retract=st.booleans(),
        seed=st.integers(0, 3),
        chunk=st.sampled_from([32, 64]),
    )
    def setup(
        self, ps: int, cache: str, overlap: bool, mixed: bool, retract: bool, seed: int, chunk: int
    ) -> None:
        swa = cache == "swa"
        mem = MemoryConfig(
            page_size=ps,
            max_total_tokens=4096,
            max_num_reqs=14,
            context_len=CONTEXT_LEN,
            cache="chunk" if cache == "chunk" else "radix",
            swa_tokens=2048 if swa else None,
            sliding_window=32 if swa else None,
        )
        config = EngineConfig(
            memory=mem,
            seed=seed,
            eos_prob=0.03,
            chunked_prefill_size=max(chunk, ps),
            enable_overlap=overlap,
            enable_mixed_chunk=mixed,
            test_retract=retract,
            enable_streaming_session=True,
        )
        self.checker = Checker(CATALOG, Level.STRICT)
        self.clock = SimClock(step_s=0.01)
        self.engine = Engine(config, clock=self.clock, observers=[CheckerHook(self.checker)])
        self.rids: list[str] = []
        self.last_rid: dict[str, str] = {}  # per session: its last request (plain sessions' parent)
        self.broken = False

    def _open(self) -> list[str]:
        return sorted(self.engine.sessions.sessions)

    @precondition(lambda self: len(self._open()) < MAX_SESSIONS)
    @rule(
        streaming=st.sampled_from([True, True, False]), timeout=st.sampled_from([None, None, 20.0])
    )
    @driving
    def open_session(self, streaming: bool, timeout: float | None) -> None:
        self.engine.open_session(1000, streaming=streaming, timeout=timeout)

    @precondition(lambda self: self._open())
    @rule(
        pick=st.integers(0, 7),
        length=st.integers(1, 60),
        seed=st.integers(0, 2**16),
        max_new=st.integers(1, 24),
        params=PARAMS,
        bos=st.booleans(),
        parent=st.booleans(),
    )
    @driving
    def session_turn(
        self,
        pick: int,
        length: int,
        seed: int,
        max_new: int,
        params: dict[str, Any],
        bos: bool,
        parent: bool,
    ) -> None:
        """A turn; a rejection is an abort with status 400 at once."""
        sids = self._open()
        sid = sids[pick % len(sids)]
        prev = self.last_rid.get(sid) if parent else None
        rid = self.engine.submit(
            tokens(length, seed, bos),
            SamplingParams(max_new_tokens=max_new),
            session_params={"id": sid, "rid": prev, **params},
        )
        self.rids.append(rid)
        self.last_rid[sid] = rid
        if rid in self.engine.results and self.engine.results[rid].finish_reason.kind == "abort":
            assert self.engine.results[rid].finish_reason.status_code == 400

    @precondition(lambda self: self._open())
    @rule(
        pick=st.integers(0, 7),
        length=st.integers(1, 40),
        seed=st.integers(0, 2**16),
        max_new=st.integers(1, 16),
        others=st.integers(0, 3),
    )
    @driving
    def turns_to_idle(self, pick: int, length: int, seed: int, max_new: int, others: int) -> None:
        """A plain append to one session and to ``others`` more, run to idle: sessions grow
        turn after turn and restore their slots."""
        sids = self._open()
        for k in range(1 + others):
            sid = sids[(pick + k) % len(sids)]
            rid = self.engine.submit(
                tokens(length + k, seed + k, True),
                SamplingParams(max_new_tokens=max_new),
                session_params={"id": sid, "rid": self.last_rid.get(sid)},
            )
            self.rids.append(rid)
            self.last_rid[sid] = rid
        self.engine.run_until_idle()

    @precondition(lambda self: self._open())
    @rule(pick=st.integers(0, 7), seed=st.integers(0, 2**16))
    @driving
    def too_long_turn(self, pick: int, seed: int) -> None:
        """An input over the context limit: aborted (400) before touching memory; the slot stays."""
        sids = self._open()
        rid = self.engine.submit(
            tokens(CONTEXT_LEN, seed, True),
            SamplingParams(max_new_tokens=4),
            session_params={"id": sids[pick % len(sids)]},
        )
        self.rids.append(rid)
        assert self.engine.results[rid].finish_reason.status_code == 400

    @rule(length=st.integers(1, 120), seed=st.integers(0, 2**16), max_new=st.integers(1, 24))
    @driving
    def plain(self, length: int, seed: int, max_new: int) -> None:
        self.rids.append(
            self.engine.submit(tokens(length, seed, True), SamplingParams(max_new_tokens=max_new))
        )

    @precondition(lambda self: self.rids)
    @rule(phase=st.sampled_from(PHASES), pick=st.integers(0, 63))
    @driving
    def abort(self, phase: str, pick: int) -> None:
        sched = self.engine.scheduler
        candidates = {
            "waiting": list(sched.waiting_queue),
            "running": list(sched.running_batch.reqs),
            "chunked": [] if sched.chunked_req is None else [sched.chunked_req],
        }.get(phase)
        if candidates is None:
            candidates = [self.engine.requests[r] for r in self.rids if r in self.engine.requests]
        if candidates:
            req = candidates[pick % len(candidates)]
            unfinished = not req.finished()
            assert self.engine.abort(req.rid) == unfinished

    @precondition(lambda self: self._open())
    @rule(pick=st.integers(0, 7))
    @driving
    def close(self, pick: int) -> None:
        sids = self._open()
        assert self.engine.close_session(sids[pick % len(sids)])

    @rule()
    @driving
    def run_until_idle_and_flush(self) -> None:
        """Idle, then (refused unless idle) flush: every slot dropped, history kept."""
        self.engine.run_until_idle()
        assert self.engine.flush_cache() and not self.engine.mem.tree_cache.slots

    @rule(seconds=st.sampled_from([5.0, 30.0]))
    @driving
    def wait(self, seconds: float) -> None:
        self.clock.t += seconds
        self.engine.step()

    @invariant()
    def nothing_recorded(self) -> None:
        assert self.checker.violations == []

    def teardown(self) -> None:
        if not hasattr(self, "engine") or self.broken:
            return
        engine = self.engine
        for sid in self._open():
            engine.close_session(sid)
        engine.run_until_idle()
        engine.step()  # deferred closes complete at the next loop iteration
        assert engine.is_idle() and not engine.sessions.sessions and not engine.mem.tree_cache.slots
        assert set(engine.results) == set(self.rids)
        view = engine.state_view("idle")
        assert all(p.free + p.evictable == p.capacity for p in view.pools)


SessionMachine.TestCase.settings = settings(SessionMachine.TestCase.settings, max_examples=150)
TestSessionMachine = SessionMachine.TestCase
