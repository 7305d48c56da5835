"""The block pool as kvspec's state view (data): one pool and one record per block.

Keeps: the pool counters are vLLM's own free count and its ref counts — free + evictable is
``free_block_queue.num_free_blocks``, protected / request-owned the blocks with ref_cnt > 0
with / without a hash — so their sum equals the capacity only if vLLM's counter and its ref
counts agree; the census input is raw block ids (the free queue walked link by link, each
request's block table), so kvspec computes the census by id on its side. Block records go
incrementally: a view lists only the blocks whose record changed since the run's previous
view (``block_changes``, each a row in BlockView's field order), kvspec's side keeps the rest
(invariants/targets/vllm/blocks.py) — every record is still read from vLLM at every view."""

from __future__ import annotations


def free_walk(pool) -> list[int]:
    """The free queue in order, link by link (a repeat is a double free)."""
    queue, out = pool.free_block_queue, []
    node = queue.fake_free_list_head.next_free_block
    while (
        node is not None and node is not queue.fake_free_list_tail and len(out) <= len(pool.blocks)
    ):
        out.append(node.block_id)
        node = node.next_free_block
    return out


_HEX: dict = {}  # a block hash (immutable bytes) -> its short hex, each computed once


def _hex(h) -> str:
    text = _HEX.get(h)
    if text is None:
        text = _HEX[h] = bytes(h).hex()[:24]
    return text


def _hash(block) -> str:
    h = block.block_hash
    return "" if h is None else _hex(h)


def _mapped(pool) -> dict[int, list[str]]:
    mapped: dict[int, list[str]] = {}
    for key, value in pool.cached_block_hash_to_block._cache.items():
        for block in [value] if hasattr(value, "block_id") else list(value.values()):
            mapped.setdefault(block.block_id, []).append(_hex(key))
    return mapped


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


def state(
    sched, event: str, step: int, block_size: int, seen: dict[int, list], in_flight: dict
) -> dict:
    """The view; ``seen`` (the run's block rows as last sent, by id) is brought up to date;
    ``in_flight``: the tokens per request of the step scheduled but not processed (async)."""
    pool = sched.kv_cache_manager.coordinator.block_pool
    walk, held, mapped = free_walk(pool), tables(sched), _mapped(pool)
    free, holders = set(walk), {}
    for blocks in held.values():
        for b in blocks:
            holders[b] = holders.get(b, 0) + 1
    changes = []
    for b in pool.blocks:
        row = [
            b.block_id,
            b.ref_cnt,
            b.block_id in free,
            _hash(b),
            mapped.get(b.block_id, []),
            holders.get(b.block_id, 0),
            b.is_null,
        ]
        if seen.get(b.block_id) != row:
            seen[b.block_id] = row
            changes.append(row)
    return {
        "event": event,
        "step": step,
        "page_size": block_size,
        "pools": [_pool(pool, walk, held, block_size)],
        "block_changes": changes,
        "block_tables": block_tables(sched, block_size, in_flight),
    }


def _pool(pool, walk: list[int], held: dict[str, list[int]], bs: int) -> dict:
    live = [b for b in pool.blocks if not b.is_null]
    free = set(walk)
    hashed = {b.block_id for b in live if b.block_hash is not None}
    evictable = len(free & hashed)
    in_use = [b for b in live if b.ref_cnt > 0]
    shared = {b for blocks in held.values() for b in blocks if b in hashed}
    owned = [("cache", sorted(shared - free))]  # a cached block some request holds
    owned += [
        (f"req:{rid}", [b for b in blocks if b not in hashed]) for rid, blocks in held.items()
    ]
    return {
        "name": "full",
        "page_size": bs,
        "capacity": len(live) * bs,
        "free": (pool.free_block_queue.num_free_blocks - evictable) * bs,
        "evictable": evictable * bs,
        "protected": sum(b.block_id in hashed for b in in_use) * bs,
        "request_owned": sum(b.block_id not in hashed for b in in_use) * bs,
        "census_input": {
            "num_pages": len(live),
            "free_pages": walk,
            "owned": owned,
            "referenced": [(f"req:{rid}", bl) for rid, bl in held.items()],
        },
    }
