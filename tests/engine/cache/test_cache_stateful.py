"""Random request lifecycles over each prefix cache keep every memory invariant: the YAML
checker runs at level 2 after every rule (match+lock+extend, decode, checkpoint, finish,
retract, evict, SWA window eviction), over the real state view."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.config import MemoryConfig
from engine.errors import KVOutOfMemory
from engine.memory import KVMemory
from engine.observe.memory_view import memory_view
from engine.request import Req
from invariants.checking.checker import Checker, Level
from invariants.checking.loader import load_catalog

CATALOG = load_catalog()
SHARED_PREFIXES = ([7] * 9, [1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12])


class CacheMachine(RuleBasedStateMachine):
    """Requests share prefixes, so the tree splits, dedups, locks and evicts; a request that
    does not fit is simply not admitted (admission control is the scheduler's job)."""

    cache = "radix"
    swa = False

    @initialize(ps=st.sampled_from([1, 2, 4, 16]), pages=st.integers(8, 24))
    def setup(self, ps: int, pages: int) -> None:
        tokens = ps * pages
        self.mem = KVMemory.from_config(
            MemoryConfig(
                page_size=ps,
                max_total_tokens=tokens,
                max_num_reqs=6,
                context_len=96,
                cache=self.cache,
                swa_tokens=tokens if self.swa else None,
                sliding_window=4 if self.swa else None,
            )
        )
        self.running: list[Req] = []
        self.count = 0
        self.checker = Checker(CATALOG, level=Level.STRICT)

    @precondition(lambda self: len(self.running) < 5)
    @rule(prefix=st.sampled_from(SHARED_PREFIXES), suffix=st.lists(st.integers(0, 20), max_size=12))
    def admit(self, prefix: list[int], suffix: list[int]) -> None:
        req = Req(f"r{self.count}", prefix + suffix)
        self.count += 1
        req.fill_ids = list(req.origin_input_ids)
        self.mem.match_prefix(req)
        self.mem.lock(req)
        try:
            self.mem.alloc_for_extend([req])
        except KVOutOfMemory:
            self.mem.tree_cache.dec_lock_ref(req.last_node, req.swa_uuid_for_lock)
            if req.req_pool_idx is not None:
                self.mem.req_to_token_pool.free(req.req_pool_idx)
            return
        req.output_ids.append(len(req.fill_ids) % 17)
        self.running.append(req)

    @precondition(lambda self: self.running)
    @rule()
    def decode(self) -> None:
        try:
            self.mem.alloc_for_decode(self.running)
        except KVOutOfMemory:
            return
        for req in self.running:
            req.output_ids.append((req.kv_committed_len * 7) % 19)
            self.mem.evict_swa(req)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 9))
    def checkpoint(self, pick: int) -> None:
        req = self.running[pick % len(self.running)]
        req.fill_ids = req.all_ids()[: req.kv_committed_len]
        self.mem.checkpoint(req)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, 9), insert=st.booleans())
    def release(self, pick: int, insert: bool) -> None:
        req = self.running.pop(pick % len(self.running))
        self.mem.release_kv_cache(req, is_insert=insert)

    @rule(tokens=st.integers(1, 64))
    def evict(self, tokens: int) -> None:
        self.mem.evict_for(self.mem.allocator.available_size() + tokens)

    @invariant()
    def yaml_checker_holds(self) -> None:
        self.checker.check("step", memory_view(self.mem, "step", self.count, self.running))

    def teardown(self) -> None:
        for req in self.running:
            self.mem.release_kv_cache(req)
        self.checker.check("idle", memory_view(self.mem, "idle", self.count, []))


class ChunkCacheMachine(CacheMachine):
    cache = "chunk"


class SWARadixCacheMachine(CacheMachine):
    swa = True


TestRadixCacheMachine = CacheMachine.TestCase
TestChunkCacheMachine = ChunkCacheMachine.TestCase
TestSWARadixCacheMachine = SWARadixCacheMachine.TestCase
