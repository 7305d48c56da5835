"""The hybrid SWA pools' state as kvspec's views need it: the second pool ("swa": SGLang's SWA
counters, the owner terms, the census input in SWA page ids), the tree's SWA part (per-node
``swa_lock_ref`` / ``swa_tombstone``, ``swa_evictable_size`` / ``swa_protected_size``) and a
KV record's SWA eviction cursor.

Keeps: the tree's node layout is read from the node (a unified tree's ``component_data``
holds SWA indices, None for a tombstone; an ``SWARadixCache`` node's ``value`` holds FULL
indices, its SWA pages reached through the allocator's ``full_to_swa_index_mapping`` unless
``swa_tombstone``); a row owns SWA ``[cpl, dead_lo) + [max(evicted, dead_lo), allocated)``
(``dead_lo``: the record's ``swa_dead_lo`` where it has one, else cpl) and reads
``[evicted, allocated)``, each position through the same mapping (0 or -1: unmapped). Runs
inside the sglang venv; imports nothing of kvspec.
"""

from __future__ import annotations

import torch

SWA_COMPONENT = 1  # ComponentType.SWA's position in a unified node's component_data


def is_hybrid(scheduler) -> bool:
    return bool(getattr(scheduler, "is_hybrid_swa", False))


def inner_tree(scheduler):
    """The tree itself (a streaming-session cache wraps it as ``.inner``)."""
    tree = scheduler.tree_cache
    return getattr(tree, "inner", tree)


def cursor(kv, source: str) -> int:
    """The record's SWA eviction cursor (``source``: the swa_cursor probe's answer); a
    record whose split part is unset (no row held) reads 0."""
    if source == "component":
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        return int(kv.get_evicted_seqlen(ComponentType.SWA))
    owner = getattr(kv, "owner", None)  # layouts.SplitRecord: the cursor is on owner.kv
    holder = kv if owner is None else owner.kv
    return int(getattr(holder, "swa_evicted_seqlen", 0) or 0)


def nodes(scheduler) -> list:
    """Every node object of the hybrid tree, root first ([] for a chunk cache)."""
    tree = inner_tree(scheduler)
    core = getattr(tree, "tree_core", None)
    root = getattr(core if core is not None else tree, "root_node", None)
    if root is None:
        return []
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.children.values())
    return found


def node_swa(node) -> tuple[int, bool, list | None]:
    """(swa lock, tombstone, SWA indices or None: FULL indices to map) of one node."""
    data = getattr(node, "component_data", None)
    if data is not None:
        part = data[SWA_COMPONENT]
        tomb = node.parent is not None and part.value is None
        value = [] if part.value is None else torch.as_tensor(part.value).long()
        return part.lock_ref, tomb, value
    return node.swa_lock_ref, bool(node.swa_tombstone), None


def tree_fields(scheduler) -> dict:
    """Node id -> its SWA lock and tombstone; {} off hybrid SWA or without a tree."""
    if not is_hybrid(scheduler):
        return {}
    found = {}
    for node in nodes(scheduler):
        lock, tomb, _ = node_swa(node)
        found[node.id] = dict(swa_lock_ref=int(lock), swa_tombstone=tomb)
    return found


def tree_sizes(scheduler) -> dict:
    tree = inner_tree(scheduler)
    if not is_hybrid(scheduler) or not hasattr(tree, "swa_evictable_size"):
        return {}
    return dict(
        swa_evictable_size=int(tree.swa_evictable_size()),
        swa_protected_size=int(tree.swa_protected_size()),
    )


def _pages(mapping, full_slots, page: int) -> list[int]:
    swa = mapping[full_slots]
    return (swa[swa > 0] // page).tolist()


def owned_spans(kv, evicted: int, page: int) -> list[tuple[int, int]]:
    """The SWA positions a row owns: ``[cpl, dead_lo) + [max(evicted, dead_lo), alloc)``."""
    cpl = kv.cache_protected_len
    dead_lo = kv.swa_dead_lo(page) if hasattr(kv, "swa_dead_lo") else cpl
    allocated = -(-kv.kv_allocated_len // page) * page
    spans = [(cpl, dead_lo)] if dead_lo > cpl else []
    return spans + [(max(evicted, dead_lo), allocated)]


def _held(kv, evicted: int, page: int) -> int:
    return sum(max(0, hi - lo) for lo, hi in owned_spans(kv, evicted, page))


def _row_census(scheduler, rows: list, source: str, mapping) -> tuple[list, list, dict]:
    """Each row's owned and read SWA pages, and the owned tokens per owner kind."""
    table, page = scheduler.req_to_token_pool.req_to_token, scheduler.page_size
    owned, referenced, terms = [], [], {True: 0, False: 0}
    for label, kv, session in rows:
        row, evicted = table[int(kv.req_pool_idx), : kv.kv_allocated_len].long(), cursor(kv, source)
        pages: list[int] = []
        for lo, hi in owned_spans(kv, evicted, page):
            pages += _pages(mapping, row[lo:hi], page)
        owned.append([label, pages])
        referenced.append([label, _pages(mapping, row[evicted:], page)])
        terms[session] += _held(kv, evicted, page)
    return owned, referenced, terms


def _tree_census(scheduler, mapping) -> list:
    """Each live (not tombstoned) node's SWA pages."""
    owned, page = [], scheduler.page_size
    for node in nodes(scheduler):
        _, tomb, value = node_swa(node)
        if node.parent is None or tomb:
            continue
        if value is None:  # SWARadixCache: full indices, mapped
            value = _pages(mapping, node.value.long(), page) if node.value is not None else []
        else:
            value = (value // page).tolist()
        if len(value):
            owned.append([f"tree:n{node.id}", value])
    return owned


def swa_pool(scheduler, rows: list, source: str, free_pages, census_input) -> dict | None:
    """The SWA pool's view record (None off hybrid SWA); ``rows``: (label, kv, is_session)
    of every row owner; ``source``: the swa_cursor probe's answer; ``free_pages``: the free
    page ids of an allocator (the free_pages probe's reader)."""
    if not is_hybrid(scheduler):
        return None
    alloc, tree, page = (
        scheduler.token_to_kv_pool_allocator,
        inner_tree(scheduler),
        scheduler.page_size,
    )
    mapping = alloc.full_to_swa_index_mapping
    owned, referenced, terms = _row_census(scheduler, rows, source, mapping)
    owned += _tree_census(scheduler, mapping)
    size = int(alloc.size_swa)

    def tree_size(name: str) -> int:
        return int(getattr(tree, name, lambda: 0)())

    return dict(
        name="swa",
        page_size=page,
        sliding_window=int(scheduler.sliding_window_size or 0),
        capacity=size,
        free=int(alloc.swa_available_size()),
        evictable=tree_size("swa_evictable_size"),
        protected=tree_size("swa_protected_size"),
        session_held=terms[True],
        request_owned=terms[False] + tree_size("swa_transient_size"),
        census_input=census_input(
            size // page, free_pages(alloc.swa_attn_allocator), owned, referenced
        ),
    )
