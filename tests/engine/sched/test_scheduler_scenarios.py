"""Scheduler scenarios in vLLM's style (tests/v1/core): a 16-page, page-size-4 pool driven a
few ``step()``s at a time, with the exact page ids taken and released in each step (the
allocator's change feed), the request rows and the tree's nodes (id → pages) pinned after it.
A change of policy — admission, chunking, mixing, the retract victim, what a finish inserts
and frees — shows up here as a diff.

Every scenario: the sim model, overlap off (schedule → forward → process in one step), page
size 4, 64 tokens = pages 1..16 (page 0, the padding page, is extra), 4 request rows."""

from __future__ import annotations

from typing import NamedTuple

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.mem.allocator import TAKEN
from engine.request import SamplingParams

PAGE = 4


class Step(NamedTuple):
    """What one step did to the pool, and the rows and tree after it."""

    taken: list[int]  # pages taken off the free list, in order
    released: list[int]  # pages returned to it, in order
    rows: dict[str, int]  # request row of each live request holding one
    nodes: dict[int, list[int]]  # tree node id -> the pages its value holds


class Scenario:
    """An engine whose allocator's changes are followed step by step."""

    def __init__(self, **engine_fields: object) -> None:
        memory = MemoryConfig(page_size=PAGE, max_total_tokens=64, max_num_reqs=4, context_len=64)
        self.engine = Engine(EngineConfig(memory=memory, enable_overlap=False, **engine_fields))
        self.log = self.engine.mem.allocator.changes.subscribe()
        self.log.take()

    def submit(self, rid: str, prompt: list[int], max_new_tokens: int) -> None:
        params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
        self.engine.submit(prompt, params, rid=rid)

    def step(self) -> Step:
        self.engine.step()
        changes, lost = self.log.take()
        assert not lost
        registry = self.engine.mem.tree_cache.node_registry()
        return Step(
            taken=[int(p) for pages, sign in changes if sign == TAKEN for p in pages],
            released=[int(p) for pages, sign in changes if sign != TAKEN for p in pages],
            rows={
                r.rid: r.req_pool_idx
                for r in self.engine.scheduler.live_reqs()
                if r.req_pool_idx is not None
            },
            nodes={
                i: sorted({int(s) // PAGE for s in n.value})
                for i, n in registry.nodes.items()
                if n is not registry.root
            },
        )

    def steps(self, count: int) -> list[Step]:
        return [self.step() for _ in range(count)]


def test_admit_and_chunk() -> None:
    """An 18-token prompt under an 8-token chunk budget: two full chunks, then the rest. Each
    chunk takes its pages; the next step stashes it into the tree (``cache_unfinished_req``,
    chunked) before the next chunk runs; the finish inserts the last full page, frees no
    tail (committed 20 is page aligned) and returns the row."""
    s = Scenario(chunked_prefill_size=8)
    s.submit("a", list(range(1, 19)), max_new_tokens=3)
    assert s.steps(5) == [
        Step([1, 2], [], {"a": 1}, {}),  # chunk [0, 8)
        Step([3, 4], [], {"a": 1}, {1: [1, 2]}),  # stash [0, 8); chunk [8, 16)
        Step([5], [], {"a": 1}, {1: [1, 2], 2: [3, 4]}),  # stash; last chunk [16, 18), token 1
        Step([], [], {"a": 1}, {1: [1, 2], 2: [3, 4]}),  # decode at 18 (page 5), token 2
        Step([], [], {}, {1: [1, 2], 2: [3, 4], 3: [5]}),  # decode at 19, token 3: [16, 20)
    ]


def test_mixed_chunk() -> None:
    """A decoding request (a) rides in each prefill batch of a 16-token prompt (b): the
    chunk budget is 8 less a's one decode token — the first chunk page-aligned (4 tokens),
    a continuing chunk takes the whole 7 (SGLang ``add_chunked_req``); b's pages are taken
    before a's decode page in each mixed batch; both finish in one decode step, b released
    first (batch order): b's tail page 8, then a's [8, 10) page 7, a's page 2 inserted."""
    s = Scenario(chunked_prefill_size=8, enable_mixed_chunk=True)
    s.submit("a", list(range(1, 6)), max_new_tokens=6)
    assert s.steps(2) == [
        Step([1, 2], [], {"a": 1}, {1: [1]}),  # prefill [0, 5), checkpoint [0, 4)
        Step([], [], {"a": 1}, {1: [1]}),  # decode at 5 (page 2)
    ]
    s.submit("b", list(range(20, 36)), max_new_tokens=2)
    assert s.steps(4) == [
        Step([3], [], {"b": 2, "a": 1}, {1: [1]}),  # b [0, 4) + a at 6
        Step([4, 5], [], {"b": 2, "a": 1}, {1: [1], 2: [3]}),  # b [4, 11) + a at 7
        Step([6, 7], [], {"b": 2, "a": 1}, {1: [1], 2: [3], 3: [4], 4: [5, 6]}),  # b done; a at 8
        Step([8], [8, 7], {}, {1: [1], 2: [3], 3: [4], 4: [5, 6], 5: [2]}),  # both finish
    ]


def test_retract() -> None:
    """A forced retract (SGLANG_TEST_RETRACT, every 3 forwards) after two decode steps: the
    victim is b — as many outputs as a, the longer prompt (docs/design.md decision 12); it frees
    its uncached page 5 (nothing enters the tree) and gives its row back; a decodes on and
    finishes (page 6 taken and freed, page 2 inserted); b re-prefills from the tree's
    [0, 8) (page 7 for [8, 11)), samples its last token and finishes."""
    s = Scenario(test_retract=True)
    s.submit("a", list(range(1, 7)), max_new_tokens=4)
    s.submit("b", list(range(11, 19)), max_new_tokens=4)
    assert s.steps(5) == [
        Step([1, 2, 3, 4], [], {"a": 1, "b": 2}, {1: [1], 2: [3, 4]}),  # both prefills
        Step([5], [], {"a": 1, "b": 2}, {1: [1], 2: [3, 4]}),  # a at 6, b at 8 (page 5)
        Step([], [], {"a": 1, "b": 2}, {1: [1], 2: [3, 4]}),  # a at 7, b at 9
        Step([6], [5, 6], {}, {1: [1], 2: [3, 4], 3: [2]}),  # b retracted; a at 8, finished
        Step([7], [7], {}, {1: [1], 2: [3, 4], 3: [2]}),  # b: [8, 11) again, finished
    ]


def test_finish_and_insert() -> None:
    """A finished request's committed KV goes to the tree (12 tokens: pages 1-3, page
    aligned, no tail); a later prompt sharing its first 10 tokens matches [0, 8) (the
    page-aligned part of the shared prefix), extends [8, 12) on page 4, and at its finish
    inserts that page and frees its decode tail (page 5)."""
    s = Scenario()
    s.submit("a", list(range(1, 11)), max_new_tokens=3)
    assert s.steps(3) == [
        Step([1, 2, 3], [], {"a": 1}, {1: [1, 2]}),  # prefill [0, 10), checkpoint [0, 8)
        Step([], [], {"a": 1}, {1: [1, 2]}),  # decode at 10
        Step([], [], {}, {1: [1, 2], 2: [3]}),  # decode at 11, finished: [8, 12) inserted
    ]
    s.submit("b", [*range(1, 11), 50, 51], max_new_tokens=2)
    assert s.steps(2) == [
        Step([4], [], {"b": 2}, {1: [1, 2], 2: [3], 3: [4]}),  # [8, 12) extended, checkpoint
        Step([5], [5], {}, {1: [1, 2], 2: [3], 3: [4]}),  # decode at 12 (page 5), finished
    ]
