"""The view records every SGLang state reader builds, the memory classes' (state.py) and the
real scheduler's (sglang_scheduler/driver/reader.py): a row's census input, a tree node's
record, a session slot's and a session's. Runs inside the sglang venv; imports nothing of
kvspec.

Keeps: the census input is the page ids each owner references, read from SGLang's own rows,
never from its counters:

    a row:   [0, cache_protected_len) the tree's (referenced); [cpl, allocated) owned
"""

from __future__ import annotations


def row_census(table, rows: list, page: int) -> tuple[list, list]:
    """(owned, referenced): per ``(label, kv)`` row, the pages it owns and all it reads (the
    table read once, as an array: a torch op per row costs more than the row)."""
    owned, referenced = [], []
    array = table.detach().to("cpu").numpy()
    for label, kv in rows:
        row = array[int(kv.req_pool_idx), : kv.kv_allocated_len]
        pages = (row if page == 1 else row // page).tolist()
        owned.append([label, pages[kv.cache_protected_len :]])
        referenced.append([label, pages])
    return owned, referenced


def census_input(num_pages: int, free_pages: list[int], owned: list, referenced: list) -> dict:
    return dict(num_pages=num_pages, free_pages=free_pages, owned=owned, referenced=referenced)


def node_record(
    node_id: int,
    parent: int,
    is_leaf: bool,
    key_len: int,
    value_len: int,
    lock_ref: int,
    parent_lock_ref: int,
    session_lock_ref: int,
) -> dict:
    """One tree node's full-pool part (a root's parent is -1)."""
    return dict(
        id=node_id,
        parent=parent,
        is_root=parent < 0,
        is_leaf=is_leaf,
        key_len=key_len,
        value_len=value_len,
        lock_ref=lock_ref,
        parent_lock_ref=parent_lock_ref,
        session_lock_ref=session_lock_ref,
    )


def slot_record(session_id: str, kv, borrowed: bool, holds_lock: bool, **extra) -> dict:
    """An idle (or borrowed) session slot holding a row."""
    return dict(
        session_id=session_id,
        req_pool_idx=int(kv.req_pool_idx),
        kv_committed_len=kv.kv_committed_len,
        kv_allocated_len=kv.kv_allocated_len,
        cache_protected_len=kv.cache_protected_len,
        borrowed=borrowed,
        holds_lock=holds_lock,
        **extra,
    )


def session_record(
    session, live: list, inflight: bool, close_on_finish: bool, has_slot: bool
) -> dict:
    """An open session; ``live``: its unfinished requests the view counts."""
    return dict(
        session_id=session.session_id,
        streaming=session.streaming,
        inflight=inflight,
        live_reqs=len(live),
        close_on_finish=close_on_finish,
        has_slot=has_slot,
        num_req_nodes=len(session.req_nodes),
    )
