"""SGLang's live state → one JSON-able view (kvspec's StateView schema, plus raw census input).

Keeps: the pool counters are SGLang's own (``available_size``, the tree's evictable and
protected sizes, ``kv_private_tokens`` over session records and over the rows requests own,
exactly as ``SchedulerInvariantChecker`` sums them); the census input is the slot ids each
owner actually references (free list, tree node values, request and session rows), sent raw
so the harness computes the census independently. Imports nothing of kvspec.
"""

from __future__ import annotations

from records import census_input, node_record, row_census, session_record, slot_record
from sglang.srt.managers.scheduler_components.pool_stats_observer import (
    kv_private_swa_tokens,
    kv_private_tokens,
)
from sglang.srt.mem_cache.unified_cache.components import ComponentType

FULL, SWA = ComponentType.FULL, ComponentType.SWA


def view(glue, event: str) -> dict:
    """The view of ``glue``'s stack at ``event`` (step, idle, session)."""
    stack = glue.stack
    cache, page = stack.cache, stack.page_size
    slots = cache.session.slots
    slot_kvs = {id(s.kv) for s in slots.values()}
    live = glue.waiting + glue.running
    owners = [r for r in glue.running if r.kv.holds_kv and id(r.kv) not in slot_kvs]
    holding = {sid: s for sid, s in slots.items() if s.kv.holds_kv}
    rows = sorted({int(s.kv.req_pool_idx) for s in holding.values()} | {_row(r) for r in owners})
    return dict(
        event=event,
        step=glue.counts["steps"],
        page_size=page,
        pools=[
            _full_pool(stack, owners, holding),
            *([_swa_pool(stack, owners, holding)] if stack.hybrid else []),
        ],
        tree=_tree(stack, slots),
        req_pool=dict(
            size=stack.rpool.size,
            free_rows=[int(x) for x in stack.rpool.free_slots],
            rows_in_use=rows,
        ),
        reqs=[_req(r, r in glue.running, id(r.kv) in slot_kvs) for r in live],
        slots=[
            _slot(sid, s, any(r.kv is s.kv for r in glue.running)) for sid, s in holding.items()
        ],
        sessions=_sessions(glue, live, slots),
        sched=_sched(glue),
    )


def _sessions(glue, live: list, slots: dict) -> list[dict]:
    """Every open session (``_session``: the requests refused at submission are left out)."""
    accepted = [r for r in live if r.rid not in glue.rejected or r.rid in glue.turn_rejected]
    return [
        _session(s, accepted, s.session_id in slots) for s in glue.stack.sessions.sessions.values()
    ]


def _sched(glue) -> dict:
    """The glue's FCFS loop as a scheduler view: every running request decodes."""
    return dict(
        num_waiting=len(glue.waiting),
        num_running=len(glue.running),
        batch_mode="decode" if glue.running else "idle",
        batch_size=len(glue.running),
        released=glue.released,
    )


def _row(req) -> int:
    return -1 if req.kv.req_pool_idx is None else int(req.kv.req_pool_idx)


def _row_owners(owners: list, holding: dict) -> list:
    """(census label, kv record) of every request row: session slots first, then requests."""
    return [
        *((f"session:{sid}@row{s.kv.req_pool_idx}", s.kv) for sid, s in holding.items()),
        *((f"req:{r.rid}@row{r.kv.req_pool_idx}", r.kv) for r in owners),
    ]


def _full_pool(stack, owners: list, holding: dict) -> dict:
    """SGLang's counters plus the raw census input (page ids per owner)."""
    page, table = stack.page_size, stack.rpool.req_to_token
    owned, referenced = row_census(table, _row_owners(owners, holding), page)
    for node in _nodes(stack.cache):
        value = node.component_data[FULL].value
        if node.parent is not None and value is not None and len(value):
            owned.append([f"tree:n{node.id}", (value.long() // page).tolist()])
    return dict(
        name="full",
        page_size=page,
        capacity=stack.pool_tokens,
        free=stack.full_free(),
        evictable=stack.full_evictable(),
        protected=stack.full_protected(),
        session_held=sum(kv_private_tokens(s.kv, page) for s in holding.values()),
        request_owned=sum(kv_private_tokens(r.kv, page) for r in owners),
        census_input=census_input(
            stack.pool_tokens // page,
            _full_allocator(stack).get_all_free_pages().long().tolist(),
            owned,
            referenced,
        ),
    )


def _full_allocator(stack):
    return stack.alloc.full_attn_allocator if stack.hybrid else stack.alloc


def _swa_pool(stack, owners: list, holding: dict) -> dict:
    """The SWA pool: SGLang's counters (``kv_private_swa_tokens``, as its invariant checker
    sums them) and the census input in SWA page ids (tree SWA values; rows through the
    allocator's full→SWA mapping over the slots each row still owns)."""
    page, table, cache = stack.page_size, stack.rpool.req_to_token, stack.cache
    mapping, swa_alloc = stack.alloc.full_to_swa_index_mapping, stack.alloc.swa_attn_allocator
    owned, referenced = [], []
    for label, kv in _row_owners(owners, holding):
        row = table[int(kv.req_pool_idx), : kv.kv_allocated_len].to("cpu").long()
        evicted = kv.get_evicted_seqlen(SWA)
        owned.append([label, _swa_pages(mapping, row, _swa_owned_spans(kv, page, len(row)), page)])
        referenced.append([label, _swa_pages(mapping, row, [(evicted, len(row))], page)])
    for node in _nodes(cache):
        value = node.component_data[SWA].value
        if node.parent is not None and value is not None and len(value):
            owned.append([f"tree:n{node.id}", (value.long() // page).tolist()])
    return dict(
        name="swa",
        page_size=page,
        capacity=stack.alloc.size_swa,
        free=stack.alloc.swa_available_size(),
        evictable=cache.swa_evictable_size(),
        protected=cache.swa_protected_size(),
        session_held=sum(kv_private_swa_tokens(s.kv, page) for s in holding.values()),
        request_owned=cache.swa_transient_size()
        + sum(kv_private_swa_tokens(r.kv, page) for r in owners),
        census_input=census_input(
            stack.alloc.size_swa // page,
            swa_alloc.get_all_free_pages().long().tolist(),
            owned,
            referenced,
        ),
    )


def _swa_owned_spans(kv, page: int, row_len: int) -> list[tuple[int, int]]:
    """The positions of a row whose SWA slots the row still owns: past its protected prefix,
    minus the out-of-window gap [dead_lo, evicted) when one has opened."""
    evicted, dead_lo = kv.get_evicted_seqlen(SWA), kv.swa_dead_lo(page)
    return (
        [(kv.cache_protected_len, dead_lo), (max(evicted, dead_lo), row_len)]
        if evicted > dead_lo
        else [(kv.cache_protected_len, row_len)]
    )


def _swa_pages(mapping, row, spans: list[tuple[int, int]], page: int) -> list[int]:
    """SWA page ids of ``row``'s positions in ``spans`` (unmapped positions skipped)."""
    found = []
    for lo, hi in spans:
        swa = mapping[row[lo:hi]]
        found += (swa[swa > 0] // page).tolist()
    return found


def _nodes(cache) -> list:
    """Every node of the Python TreeCore, root first."""
    found, stack = [], [cache.tree_core.root_node]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.children.values())
    return found


def _session_locks(cache, slots: dict, hybrid: bool) -> tuple[dict[int, int], dict[int, int]]:
    """Per node, how many session slots' turn-1 locks cover it: the full lock covers the
    path to the root; the SWA part only up to the receipt's SWA boundary node."""
    core, full, swa = cache.tree_core, {}, {}
    for slot in slots.values():
        node = None if slot.lock is None else core.node_by_id(slot.lock.node)
        cur = node
        while cur is not None and cur.parent is not None:
            full[cur.id] = full.get(cur.id, 0) + 1
            cur = cur.parent
        if not hybrid or node is None or slot.lock.swa_released:
            continue
        boundary = slot.lock.receipt.component_lock_uuids.get(SWA)
        cur = node
        while cur.parent is not None:
            swa[cur.id] = swa.get(cur.id, 0) + 1
            if boundary is not None and cur.component_data[SWA].metadata.get("uuid") == boundary:
                break
            cur = cur.parent
    return full, swa


def _tree(stack, slots: dict) -> dict:
    cache, hybrid = stack.cache, stack.hybrid
    session_full, session_swa = _session_locks(cache, slots, hybrid)
    nodes = [_node(node, hybrid, session_full, session_swa) for node in _nodes(cache)]
    sizes = (
        dict(
            swa_evictable_size=cache.swa_evictable_size(),
            swa_protected_size=cache.swa_protected_size(),
        )
        if hybrid
        else {}
    )
    return dict(
        kind="swa_radix" if hybrid else "radix",
        page_size=stack.page_size,
        evictable_size=stack.full_evictable(),
        protected_size=stack.full_protected(),
        nodes=nodes,
        **sizes,
    )


def _node(node, hybrid: bool, session_full: dict[int, int], session_swa: dict[int, int]) -> dict:
    """One tree node's view: its full part, and its SWA part when the pools are hybrid."""
    data, parent = node.component_data[FULL], node.parent
    fields = node_record(
        node.id,
        -1 if parent is None else parent.id,
        not node.children,
        0 if node.key is None else len(node.key),
        0 if data.value is None else len(data.value),
        data.lock_ref,
        0 if parent is None else parent.component_data[FULL].lock_ref,
        session_full.get(node.id, 0),
    )
    if hybrid:
        swa = node.component_data[SWA]
        fields.update(
            swa_lock_ref=swa.lock_ref,
            swa_tombstone=parent is not None and swa.value is None,
            parent_swa_lock_ref=0 if parent is None else parent.component_data[SWA].lock_ref,
            session_swa_lock_ref=session_swa.get(node.id, 0),
        )
    return fields


def _req(req, running: bool, borrows: bool) -> dict:
    """A live request. A waiting one whose match already borrowed its session's record
    (SGLang's FCFS matches the head before the memory gate) owns no row: the slot does."""
    kv = req.kv
    return dict(
        rid=req.rid,
        req_pool_idx=-1 if borrows and not running else _row(req),
        seq_len=len(req.full_untruncated_fill_ids or ()),
        kv_committed_len=kv.kv_committed_len,
        kv_allocated_len=kv.kv_allocated_len,
        cache_protected_len=kv.cache_protected_len,
        swa_evicted_seqlen=kv.get_evicted_seqlen(SWA),
        origin_len=len(req.origin_input_ids),
        num_output=len(req.output_ids),
        finished=req.finished(),
        to_finish=req.to_finish is not None,
        in_waiting=not running,
        in_running=running,
        in_batch=running,
    )


def _slot(session_id: str, slot, borrowed: bool) -> dict:
    evicted = slot.kv.get_evicted_seqlen(SWA)
    return slot_record(
        session_id, slot.kv, borrowed, slot.lock is not None, swa_evicted_seqlen=evicted
    )


def _session(session, live: list, has_slot: bool) -> dict:
    """An open session; ``live`` leaves out requests refused at submission, which SGLang
    queues for a 1-token prefill (their 400 is already decided; kvspec answers at once) —
    except a turn refused after the session accepted it, which holds the session in flight."""
    mine = [r for r in live if r.session is session and not r.finished()]
    return session_record(session, mine, session._inflight, session.close_on_finish, has_slot)
