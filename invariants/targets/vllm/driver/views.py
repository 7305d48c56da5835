"""What a view reads of vLLM's scheduler (data): each request's table per KV-cache group, the
block pool (pool_reads.py), who holds blocks besides the requests, and under async scheduling
what the step in flight reads (``step_reads``, taken when it was scheduled).

Keeps: the driver only reads — the pool's blocks, free-queue links and keys as what vLLM wrote
since the last view (pool_reads.py), a table again only when it is not the very same list as
the view before — and kvspec's side derives the free queue's walk, each block's record, the
pool's counters and the census input from the reads (invariants/targets/vllm/pool.py): the
driver's process is the engine's, and the derivation runs beside it while it steps.
"""

from __future__ import annotations

from itertools import compress
from operator import attrgetter, ne
from typing import Any, NamedTuple

from census_deltas import CROSSCHECK
from in_flight import Read, in_flight_views, is_mamba, local_span
from vllm.v1.request import RequestStatus

WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS
BLOCK_ID = attrgetter("block_id")


class Table(NamedTuple):
    """One request's table in one KV-cache group, read once a view."""

    manager: Any
    rid: str
    real: list[int]  # its real blocks' ids
    head: tuple  # its row in ``block_tables`` before the counts that move every step
    tail: tuple  # ... and after them (``TABLE_FIELDS``)


def read_tables(sched, last: dict) -> tuple[list[Table], set]:
    """Every request's table in every KV-cache group, and the keys ``(group, rid)`` of those
    new, changed or gone since the view before; ``last`` holds, per group, each table as read
    then (a copy of its blocks, and the Table made of them) and is brought up to date: a table
    whose blocks are the very same (most, most steps: a block holds many tokens) is not read
    again — which are is found at C speed (identical blocks compare by identity)."""
    null = sched.kv_cache_manager.coordinator.block_pool.null_block.block_id
    out, moved = [], set()
    for manager in sched.kv_cache_manager.coordinator.single_type_managers:
        group, now = manager.kv_cache_group_id, manager.req_to_blocks
        copies, made = last.setdefault(group, ({}, {}))
        for rid in copies.keys() - now.keys():  # the tables gone since
            del copies[rid], made[rid]
            moved.add((group, rid))
        rids = list(now)
        stale = list(compress(rids, map(ne, now.values(), map(copies.get, rids))))
        shared = _group(manager) if stale else None
        for rid in stale:
            old, copies[rid] = copies.get(rid), list(now[rid])
            made[rid] = _table(manager, rid, (copies[rid], old, made.get(rid)), null, shared)
            moved.add((group, rid))
        out += map(made.__getitem__, rids)
    return out, moved


def _table(manager, rid: str, reads: tuple, null: int, group: dict) -> Table:
    """``reads``: the table's blocks now, and as last read (None: new) with its Table."""
    blocks, old, last = reads
    ids = _grown(blocks, old, last)
    ids = list(map(BLOCK_ID, blocks)) if ids is None else ids
    real, nulls = _real_and_nulls(ids, null)
    head = (rid, group["group"], group["window"], group["chunk"])
    tail = (group["block_size"], len(ids), nulls, group["kind"], group["spec_blocks"])
    return Table(manager, rid, real, head, tail)


def _grown(blocks: list, old: list | None, last: Table | None) -> list[int] | None:
    """The ids of a table that only grew at its end since it was last read, without a null
    block then: the last ones and the new blocks' (at block size 1 a table grows by a block
    a step; the rest compared by identity, at C speed). None: read it whole."""
    if last is None or old is None or last.tail[2] or blocks[: len(old)] != old:
        return None
    return last.real + list(map(BLOCK_ID, blocks[len(old) :]))


def _real_and_nulls(ids: list[int], null: int) -> tuple[list[int], list[int]]:
    """A table's real blocks and the positions of the null block (most often none, or the
    table's first blocks: what a window or chunk dropped — both found at C speed)."""
    n = ids.count(null)
    if not n:
        return ids, []
    if ids[:n].count(null) == n:
        return ids[n:], list(range(n))
    return [b for b in ids if b != null], [i for i, b in enumerate(ids) if b == null]


def deferred(sched) -> dict[str, list[int]]:
    """Each batch of frees vLLM deferred past the step in flight (``deferred:<fence step>``),
    its real blocks."""
    return {
        f"deferred:{fence}#{i}": [b.block_id for b in blocks if not b.is_null]
        for i, (fence, blocks) in enumerate(getattr(sched, "deferred_frees", ()))
    }


def owners(sched, read: list[Table]) -> dict:
    """Who holds blocks besides the tables' requests, and as what: each request's kind —
    ``req``, ``load`` (its blocks await a connector load: WAITING_FOR_REMOTE_KVS, or finished
    with the load in flight) or ``send`` (finished, its free delayed by the connector) — and
    each batch of frees deferred past the step in flight (``fenced``): an in-flight transfer
    is an owner, as a request is."""
    requests = sched.requests
    kinds = {t.rid: _holder(sched, requests.get(t.rid)) for t in read}
    return {"kinds": kinds, "fenced": deferred(sched)}


def holdings(read: list[Table]) -> dict:
    """Every table's real blocks by a key that lasts across views, ``(group, rid)``: a table
    changes at its ends, a holder's blocks over all its groups anywhere."""
    return {(t.manager.kv_cache_group_id, t.rid): t.real for t in read}


def _holder(sched, request) -> str:
    if request is None:
        return "req"
    if request.is_finished():  # still listed: the connector holds its blocks
        loads = getattr(sched.connector, "loads", {})
        return "load" if request.request_id in loads else "send"
    return "load" if request.status == WAITING_FOR_REMOTE_KVS else "req"


# a block table's row, field by field (kvspec's BlockTableView: its side checks the names)
TABLE_FIELDS = ("rid", "group", "window", "chunk", "computed", "in_flight", "block_size")
TABLE_FIELDS += ("num_blocks", "null_blocks", "kind", "spec_blocks")


def block_tables(sched, read: list[Table], in_flight: dict[str, int]) -> dict:
    """Each request's table per KV-cache group (``read``: ``read_tables``) as a row of
    ``TABLE_FIELDS``: the group's block size, its sliding window or attention chunk, computed
    tokens (``in_flight`` of them scheduled in a step not yet processed), null entries. A
    request whose async load failed has no computed count (-1): vLLM reset it to 0 and frees
    or re-caches the table at the next schedule, before any forward reads it
    (_update_waiting_for_remote_kv)."""
    failed, requests = getattr(sched, "failed_recving_kv_req_ids", ()), sched.requests
    rows = []
    for table in read:
        rid = table.rid
        request = None if rid in failed else requests.get(rid)
        computed = request.num_computed_tokens if request is not None else -1
        rows.append((*table.head, computed, in_flight.get(rid, 0), *table.tail))
    return {"fields": TABLE_FIELDS, "rows": rows}


def _group(manager) -> dict:
    """What a KV-cache group's tables share: its name, window, chunk, block size, kind."""
    window, chunk = local_span(manager)
    kind = "mamba" if is_mamba(manager) else "attention"
    return {
        "group": f"{manager.kv_cache_group_id}:{type(manager).__name__}",
        "window": window,
        "chunk": chunk,
        "block_size": manager.block_size,
        "kind": kind,
        "spec_blocks": getattr(manager, "num_speculative_blocks", 0) if kind == "mamba" else 0,
    }


def group_layout(sched) -> list[str]:
    """Each KV-cache group as its spec and block size, then the scheduler's block size (what
    the run's notes say was laid out)."""
    managers = sched.kv_cache_manager.coordinator.single_type_managers
    out = [f"{type(m.kv_cache_spec).__name__}@{m.block_size}" for m in managers]
    return out + [f"scheduler@{sched.block_size}"]


def state(sched, event: str, step: int, block_size: int, reads_of, reads: list[Read]) -> dict:
    """The view; ``reads_of`` (pool_reads.PoolReads: the run's pool reads as last sent) is
    brought up to date; ``reads``: what the step scheduled but not processed (async) reads
    and writes (in_flight.py; its tokens are in the tables' ``in_flight``)."""
    in_flight = {read.rid: read.tokens for read in reads}
    pool = sched.kv_cache_manager.coordinator.block_pool
    read, moved = read_tables(sched, reads_of.tables)
    if CROSSCHECK and read != read_tables(sched, {})[0]:  # every table read again
        raise AssertionError("block tables kept across views differ from the tables' now")
    held = holdings(read)
    return {
        "event": event,
        "step": step,
        "page_size": block_size,
        "pool": reads_of.read(pool, held, moved, owners(sched, read)),
        "block_table_rows": block_tables(sched, read, in_flight),
        **in_flight_views(sched, reads, leading_nulls(read) if reads else {}),
    }


def leading_nulls(read: list[Table]) -> dict:
    """Each table's count of leading null blocks by ``(group, rid)`` (None: a null block past
    them — its real blocks are not the table's from some place on)."""
    out = {}
    for table in read:
        nulls = table.tail[2]
        leading = not nulls or nulls[-1] == len(nulls) - 1  # (positions ascend: 0..n-1)
        out[table.manager.kv_cache_group_id, table.rid] = len(nulls) if leading else None
    return out
