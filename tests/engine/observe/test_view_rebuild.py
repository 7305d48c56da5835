"""The optimised state view (incremental tree nodes and census owners, interned request views,
the live list and places without generators) equals a straightforward rebuild at every event
of real engine runs, radix and SWA radix, with and without the overlap schedule."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.cache.swa_radix_cache import SWARadixCache
from engine.cache.tree_util import all_nodes, node_view
from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.observe.req_views import ReqPlaces
from engine.request import Req
from engine.view import ReqView


def _ref_req_view(r: Req, places: ReqPlaces) -> ReqView:
    """The request view as ``snapshot`` built it before interning."""
    return ReqView(
        rid=r.rid,
        req_pool_idx=-1 if r.req_pool_idx is None else r.req_pool_idx,
        seq_len=len(r.fill_ids),
        kv_committed_len=r.kv_committed_len,
        kv_allocated_len=r.kv_allocated_len,
        cache_protected_len=r.cache_protected_len,
        swa_evicted_seqlen=r.swa_evicted_seqlen,
        is_chunked=r.is_chunked,
        kv_committed_freed=r.kv_committed_freed,
        kv_overallocated_freed=r.kv_overallocated_freed,
        origin_len=len(r.origin_input_ids),
        num_output=len(r.output_ids),
        finished=r.finished(),
        to_finish=r.to_finish is not None,
        is_retracted=r.is_retracted,
        in_waiting=r in places.waiting,
        in_running=r in places.running,
        in_batch=r in places.batch,
    )


def _ref_live_reqs(sched: Any) -> list[Req]:
    """The live requests as ``Scheduler.live_reqs`` listed them through a generator."""

    def candidates() -> Iterator[Req]:
        yield from (r for r in sched.waiting_queue if r.req_pool_idx is not None)
        if sched.chunked_req is not None:
            yield sched.chunked_req
        yield from sched.running_batch.reqs
        for batch in (sched.cur_batch, sched.last_batch):
            if batch is not None:
                yield from batch.reqs
        for queued, _ in sched.result_queue:
            yield from queued.reqs

    return list(dict.fromkeys(candidates()))


class Compare:
    """At every event: tree nodes, census owners and request views equal a rebuild."""

    def __init__(self) -> None:
        self.events = 0
        self.queued = 0  # events with a batch in the overlap result queue

    def on_event(self, event: str, engine: Any) -> None:
        self.events += 1
        cache = engine.mem.tree_cache
        inner = getattr(cache, "inner", cache)
        if hasattr(inner, "root_node"):
            swa = isinstance(inner, SWARadixCache)
            root, attr = inner.root_node, "full_lock_ref" if swa else "lock_ref"
            nodes = all_nodes(root)
            assert inner.tree_view().nodes == tuple(node_view(n, n is root, attr) for n in nodes)
            owners = [(o.label, o.slots.tolist(), o.holds_swa) for o in inner.slot_owners()]
            assert owners == [
                (f"tree:n{n.id}", n.value.tolist(), not swa or not n.swa_tombstone)
                for n in nodes[1:]
            ]
        sched, batch = engine.scheduler, engine.scheduler.cur_batch
        places = ReqPlaces(
            set(sched.waiting_queue),
            set(sched.running_batch.reqs),
            set(batch.reqs) if batch is not None else frozenset(),
        )
        live = _ref_live_reqs(sched)
        assert sched.live_reqs() == live  # the same requests (Req compares by identity), in order
        self.queued += bool(sched.result_queue)
        got = engine.state_view(event).reqs
        ref = tuple(_ref_req_view(r, places) for r in live)
        assert [[(getattr(v, f), type(getattr(v, f))) for f in ReqView._fields] for v in got] == [
            [(getattr(v, f), type(getattr(v, f))) for f in ReqView._fields] for v in ref
        ]


@pytest.mark.parametrize(("hybrid", "overlap"), [(False, True), (True, True), (False, False)])
def test_views_equal_a_rebuild_through_engine_runs(hybrid: bool, overlap: bool) -> None:
    memory = (
        MemoryConfig(max_total_tokens=384, swa_tokens=384, sliding_window=16)
        if hybrid
        else MemoryConfig(max_total_tokens=384)
    )
    compare = Compare()
    engine = Engine(EngineConfig(memory=memory, enable_overlap=overlap), observers=[compare])
    prompts = [[1, 2, 3, 4] * k + [k] * 7 for k in range(1, 10)] + [[1, 2, 3, 4] * 6]
    engine.generate(prompts)
    engine.generate([[1, 2, 3, 4] * 5 + [9] * 60, [5] * 90])
    assert compare.events > 50 and (compare.queued > 0) == overlap
    assert isinstance(engine.mem.tree_cache, SWARadixCache) == hybrid
