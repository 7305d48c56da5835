"""The block pool as kvspec's state view (data): one pool and one record per block.

Keeps: the pool counters are vLLM's own free count and its ref counts — free + evictable is
``free_block_queue.num_free_blocks``, protected / request-owned the blocks with ref_cnt > 0
with / without a hash — so their sum equals the capacity only if vLLM's counter and its ref
counts agree; the census input is raw block ids (the free queue walked link by link, each
request's block table), so kvspec computes the census by id on its side. Block records go
incrementally: a view lists only the blocks whose record changed since the run's previous
view (``block_changes``: records.py, which says which blocks it re-reads), kvspec's side keeps
the rest (invariants/targets/vllm/blocks.py); the census input goes as what changed too
(driverlib/census_deltas.py, by main.py)."""

from __future__ import annotations


def free_walk(pool) -> list[int]:
    """The free queue in order, link by link (a repeat is a double free; a cycle stops one
    past the pool's size)."""
    queue, out = pool.free_block_queue, []
    append, tail = out.append, queue.fake_free_list_tail
    node = queue.fake_free_list_head.next_free_block
    for _ in range(len(pool.blocks) + 1):
        if node is None or node is tail:
            break
        append(node.block_id)
        node = node.next_free_block
    return out


def tables(sched) -> dict[str, list[int]]:
    """Each request's blocks over every KV-cache group (the null block left out)."""
    out: dict[str, list[int]] = {}
    for manager in sched.kv_cache_manager.coordinator.single_type_managers:
        for rid, blocks in manager.req_to_blocks.items():
            out.setdefault(rid, []).extend(b.block_id for b in blocks if not b.is_null)
    return out


def block_tables(sched, block_size: int, in_flight: dict[str, int]) -> list[dict]:
    """Each request's table per KV-cache group: its window, computed tokens (``in_flight``
    of them scheduled in a step not yet processed), null entries."""
    out = []
    for manager in sched.kv_cache_manager.coordinator.single_type_managers:
        window = getattr(manager, "sliding_window", None) or 0
        for rid, blocks in manager.req_to_blocks.items():
            request = sched.requests.get(rid)
            out.append(
                {
                    "rid": rid,
                    "group": f"{manager.kv_cache_group_id}:{type(manager).__name__}",
                    "window": window,
                    "block_size": block_size,
                    "num_blocks": len(blocks),
                    "computed": request.num_computed_tokens if request is not None else -1,
                    "in_flight": in_flight.get(rid, 0),
                    "null_blocks": [i for i, b in enumerate(blocks) if b.is_null],
                }
            )
    return out


def state(sched, event: str, step: int, block_size: int, records, in_flight: dict) -> dict:
    """The view; ``records`` (records.Records: the run's block records as last sent) is
    brought up to date; ``in_flight``: the tokens per request of the step scheduled but not
    processed (async)."""
    pool = sched.kv_cache_manager.coordinator.block_pool
    walk, held = free_walk(pool), tables(sched)
    changes = records.changes(pool, walk, held)
    return {
        "event": event,
        "step": step,
        "page_size": block_size,
        "pools": [_pool(pool, walk, held, block_size, records)],
        "block_changes": changes,
        "block_tables": block_tables(sched, block_size, in_flight),
    }


def _pool(pool, walk: list[int], held: dict[str, list[int]], bs: int, records) -> dict:
    hashed, in_use, free = records.hashed, records.in_use, records.free
    evictable = len(free & hashed)
    shared = {b for blocks in held.values() for b in blocks if b in hashed}
    owned = [("cache", sorted(shared - free))]  # a cached block some request holds
    owned += [
        (f"req:{rid}", [b for b in blocks if b not in hashed]) for rid, blocks in held.items()
    ]
    live = len(pool.blocks) - len(records.null)
    return {
        "name": "full",
        "page_size": bs,
        "capacity": live * bs,
        "free": (pool.free_block_queue.num_free_blocks - evictable) * bs,
        "evictable": evictable * bs,
        "protected": len(in_use & hashed) * bs,
        "request_owned": len(in_use - hashed) * bs,
        "census_input": {
            "num_pages": live,
            "free_pages": walk,
            "owned": owned,
            "referenced": [(f"req:{rid}", bl) for rid, bl in held.items()],
        },
    }
