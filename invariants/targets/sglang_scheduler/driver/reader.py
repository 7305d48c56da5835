"""The real scheduler's live state → one JSON-able view (kvspec's StateView schema, plus the raw
census input), read through the release's adapter (its layouts chosen by probes).

Keeps: the pool counters are SGLang's own, summed as its busy check sums them (``counters``);
the census input (records.py, shared with the memory classes' reader) is computed
independently of SGLang's notion of ownership — from every request the scheduler holds
anywhere (waiting queue, chunk, running batch, the launched and last batches, the overlap
result queue), every session slot and every tree node, each owner listing the page ids its row
or value references — so a request SGLang forgot still shows up (its pages as owned or
orphaned), and the harness names duplicates, orphans and dangling pages by id. Runs inside
the sglang venv; imports nothing of kvspec.

    a request's row:  [0, cache_protected_len) read (the tree's); [cpl, allocated) owned
    a session slot:   [cpl, allocated) owned while no running request borrows it
"""

from __future__ import annotations

from records import census_input, node_record, row_census, session_record, slot_record

# SGLang aborts every request whose rid *starts with* the abort's rid (a tokenizer's rids are
# uuids); the driver ends each trace rid with this mark so that abort r1 spares r10
END = "\x1f"


def sglang_rid(rid: str) -> str:
    return rid + END


def trace_rid(req) -> str:
    """A request's rid as the trace wrote it."""
    return req.rid.removesuffix(END)


def live_requests(scheduler) -> list:
    """Every request the scheduler holds, once each, in the order a reader meets them."""
    found, seen = [], set()
    batches = [scheduler.running_batch, scheduler.last_batch, getattr(scheduler, "cur_batch", None)]
    batches += [batch for batch, _ in getattr(scheduler, "result_queue", ())]
    groups = [scheduler.waiting_queue, [scheduler.chunked_req]]
    groups += [batch.reqs for batch in batches if batch is not None]
    for group in groups:
        for req in group:
            if req is not None and id(req) not in seen:
                seen.add(id(req))
                found.append(req)
    return found


def view(scheduler, adapter, event: str, step: int, refused: frozenset = frozenset()) -> dict:
    """The view at ``event`` (step, idle, session) after ``step`` iterations; ``refused``:
    the rids a session refused at submission (SGLang queues each for a 1-token prefill to
    answer it; kvspec answers at once, so it is never one of its session's live requests)."""
    page = scheduler.page_size
    slots = adapter.session_slots(scheduler, refused)
    slot_kvs = {id(kv) for kv, _ in slots.values()}
    live = live_requests(scheduler)
    waiting = {id(r) for r in scheduler.waiting_queue}
    running = {id(r) for r in scheduler.running_batch.reqs}
    batch = scheduler.last_batch
    in_batch = set() if batch is None else {id(r) for r in batch.reqs}
    borrowers = {id(adapter.req_kv(r)) for r in live if id(r) in running or id(r) in in_batch}
    owners = [r for r in live if adapter.req_kv(r).req_pool_idx is not None]
    owners = [r for r in owners if id(adapter.req_kv(r)) not in slot_kvs]
    held = {sid: kv for sid, (kv, _) in slots.items() if kv.req_pool_idx is not None}
    accepted = [r for r in live if trace_rid(r) not in refused]
    open_sessions = adapter.sessions(scheduler)
    spec = _speculative(scheduler)
    nodes = adapter.tree_nodes(scheduler)
    return dict(
        event=event,
        step=step,
        page_size=page,
        pools=_pools(scheduler, adapter, owners, held, nodes),
        tree=_tree(scheduler, adapter, nodes, [node for _, node in slots.values()]),
        req_pool=_req_pool(scheduler, adapter, owners, held),
        reqs=[
            _req(r, adapter, waiting, running, in_batch, slot_kvs) | spec.req_fields(r)
            for r in live
        ],
        slots=[
            slot_record(sid, kv, id(kv) in borrowers, lock is not None, **_slot_swa(adapter, kv))
            for sid, (kv, lock) in slots.items()
            if kv.req_pool_idx is not None
        ],
        sessions=[_session(adapter, s, accepted, s.session_id in held) for s in open_sessions],
        sched=_sched(scheduler, adapter) | spec.sched_fields(),
    )


class _NoSpeculation:
    """A configuration that does not speculate: the views' speculative fields keep their
    defaults (spec_mode "off", spec_seq_len -1)."""

    def req_fields(self, req) -> dict:
        return {}

    def sched_fields(self) -> dict:
        return {}


def _speculative(scheduler):
    """The fake speculative worker (drafts.py), which reports the speculative fields of
    the views (the mode, the window, each request's last verify); else ``_NoSpeculation``."""
    worker = getattr(scheduler, "draft_worker", None)
    return worker if hasattr(worker, "req_fields") else _NoSpeculation()


def _slot_swa(adapter, kv) -> dict:
    """A slot's SWA cursor, on hybrid SWA pools only (the plain views stay as they were)."""
    return dict(swa_evicted_seqlen=adapter.swa_evicted(kv)) if adapter.swa else {}


def _pools(scheduler, adapter, owners: list, held: dict, nodes: list) -> list[dict]:
    """The full pool, and the SWA pool where the pools are hybrid SWA."""
    found = [_pool(scheduler, adapter, owners, held, nodes)]
    if adapter.swa:
        rows = [(f"session:{sid}@row{kv.req_pool_idx}", kv, True) for sid, kv in held.items()]
        rows += [
            (f"req:{trace_rid(r)}@row{adapter.req_kv(r).req_pool_idx}", adapter.req_kv(r), False)
            for r in owners
        ]
        swa = adapter.swa_pool(scheduler, rows, census_input)
        found += [] if swa is None else [swa]
    return found


def _pool(scheduler, adapter, owners: list, held: dict, nodes: list) -> dict:
    """The allocator's and tree's counters, the two owner terms summed from the rows found
    (not from SGLang's own sums), and the raw census input (page ids per owner)."""
    page, table = scheduler.page_size, scheduler.req_to_token_pool.req_to_token
    slot_rows = [(f"session:{sid}@row{kv.req_pool_idx}", kv) for sid, kv in held.items()]
    req_rows = [
        (f"req:{trace_rid(r)}@row{adapter.req_kv(r).req_pool_idx}", adapter.req_kv(r))
        for r in owners
    ]
    owned, referenced = row_census(table, slot_rows + req_rows, page)
    for node_id, parent, _, value, _ in nodes:
        if parent >= 0 and value:
            pages = value if page == 1 else [slot // page for slot in value]
            owned.append([f"tree:n{node_id}", pages])
    counters = adapter.counters(scheduler)
    return dict(
        name="full",
        page_size=page,
        **counters,
        session_held=sum(_private(kv, page) for _, kv in slot_rows),
        request_owned=sum(_private(kv, page) for _, kv in req_rows),
        census_input=census_input(
            counters["capacity"] // page, adapter.free_pages(scheduler), owned, referenced
        ),
    )


def _private(kv, page: int) -> int:
    """Tokens of the pool a row holds beyond the tree's part (whole pages)."""
    return -(-kv.kv_allocated_len // page) * page - kv.cache_protected_len


def _tree(scheduler, adapter, nodes: list, session_locks: list) -> dict:
    """The tree's counters and ``nodes`` (the adapter's records of them); ``session_locks``:
    the node each slot's lock holds."""
    locks = {node_id: lock for node_id, _, _, _, lock in nodes}
    parents = {node_id: parent for node_id, parent, _, _, _ in nodes}
    inner = set(parents.values())
    by_session: dict = {}
    for node_id in session_locks:  # a lock covers its node's path to the root
        while node_id is not None and parents.get(node_id, -1) >= 0:
            by_session[node_id] = by_session.get(node_id, 0) + 1
            node_id = parents[node_id]
    counters = adapter.counters(scheduler)  # hybrid SWA: the full side's sizes
    swa = adapter.tree_swa(scheduler) if adapter.swa else {}
    return dict(
        kind=("swa_radix" if swa else "radix") if nodes else "chunk",
        page_size=scheduler.page_size,
        evictable_size=counters["evictable"],
        protected_size=counters["protected"],
        **(adapter.tree_swa_sizes(scheduler) if swa else {}),
        nodes=[
            _node_swa(node_id, parent, swa)
            | node_record(
                node_id,
                parent,
                node_id not in inner,
                key_len,
                len(value),
                lock,
                locks.get(parent, 0),
                by_session.get(node_id, 0),
            )
            for node_id, parent, key_len, value, lock in nodes
        ],
    )


def _node_swa(node_id: int, parent: int, swa: dict) -> dict:
    """A node's SWA fields with its parent's SWA lock ({} off hybrid SWA). Session SWA locks
    are not split out (``session_swa_lock_ref`` stays 0)."""
    if not swa:
        return {}
    parent_lock = swa[parent]["swa_lock_ref"] if parent in swa else 0
    return dict(swa[node_id], parent_swa_lock_ref=parent_lock)


def _req_pool(scheduler, adapter, owners: list, held: dict) -> dict:
    pool = scheduler.req_to_token_pool
    rows = {int(kv.req_pool_idx) for kv in held.values()}
    rows |= {int(adapter.req_kv(r).req_pool_idx) for r in owners}
    return dict(
        size=pool.size, free_rows=[int(x) for x in pool.free_slots], rows_in_use=sorted(rows)
    )


def _req(req, adapter, waiting: set, running: set, in_batch: set, slot_kvs: set) -> dict:
    """A live request; one running on its session slot's record owns no row (the slot does)."""
    kv = adapter.req_kv(req)
    row = -1 if kv.req_pool_idx is None or id(kv) in slot_kvs else int(kv.req_pool_idx)
    # a released record keeps its committed length for SGLang's stats; kvspec's views
    # read a request that holds no KV as holding none
    released = kv.req_pool_idx is None and kv.kv_allocated_len == 0
    return dict(
        rid=trace_rid(req),
        req_pool_idx=row,
        seq_len=adapter.fill_len(req),
        kv_committed_len=0 if released else kv.kv_committed_len,
        kv_allocated_len=kv.kv_allocated_len,
        cache_protected_len=kv.cache_protected_len,
        swa_evicted_seqlen=adapter.swa_evicted(kv),
        is_chunked=int(getattr(req, "is_chunked", 0)),
        origin_len=len(req.origin_input_ids),
        num_output=len(req.output_ids),
        finished=req.finished(),
        to_finish=req.to_finish is not None,
        is_retracted=bool(getattr(req, "is_retracted", False)),
        in_waiting=id(req) in waiting,
        in_running=id(req) in running,
        in_batch=id(req) in in_batch,
    )


def _session(adapter, session, live: list, has_slot: bool) -> dict:
    """An open session (one whose close is deferred included)."""
    mine = [r for r in live if getattr(r, "session", None) is session and not r.finished()]
    inflight, close_on_finish = adapter.session_state(session, mine)
    return session_record(session, mine, inflight, close_on_finish, has_slot)


def _sched(scheduler, adapter) -> dict:
    batch, chunked = scheduler.last_batch, scheduler.chunked_req
    deferred = {}
    if adapter.swa and chunked is not None:  # a continuing chunk SGLang held back a round
        missing = batch is None or all(r is not chunked for r in batch.reqs)
        deferred["chunk_deferred"] = missing and adapter.chunk_deferred()
    return deferred | dict(
        overlap=bool(scheduler.enable_overlap),
        num_waiting=len(scheduler.waiting_queue),
        num_running=len(scheduler.running_batch.reqs),
        batch_mode="idle" if batch is None else batch.forward_mode.name.lower(),
        batch_size=0 if batch is None else len(batch.reqs),
        chunked_rids=[] if chunked is None else [trace_rid(chunked)],
        max_running_requests=int(scheduler.max_running_requests),
    )


class Retracts:
    """The rids SGLang's own ``retract_decode`` sends back to the waiting queue, kept until
    the answer of their iteration takes them. It wraps the method of the release's batch
    class as the scheduler holds it, so no module path is named here."""

    def __init__(self, scheduler) -> None:
        self.rids: list[str] = []
        cls = type(scheduler.running_batch)
        real = cls.retract_decode

        def recording(batch, *args, **kwargs):
            result = real(batch, *args, **kwargs)
            self.rids += [trace_rid(req) for req in result[0]]  # (retracted, ratio, ...)
            return result

        cls.retract_decode = recording

    def take(self) -> list[str]:
        taken, self.rids = self.rids, []
        return taken


def batch(scheduler, retracted: list[str], finished: list[str]) -> dict:
    """The batch SGLang ran in the iteration just ended (``last_batch``): its forward mode,
    each request with the tokens it got (extend and mixed: SGLang's ``extend_lens``, which
    count a mixed batch's decoding requests as 1; decode: 1 each), in batch order; and the
    rids retracted, and those whose finish SGLang sent, in the iteration."""
    last, done = scheduler.last_batch, dict(retracted=retracted, finished=finished)
    if last is None:
        return dict(mode="idle", reqs=[], **done)
    mode = last.forward_mode
    lens = list(last.extend_lens) if mode.is_extend() else [1] * len(last.reqs)
    reqs = [[trace_rid(req), int(n)] for req, n in zip(last.reqs, lens)]
    return dict(mode=mode.name.lower(), reqs=reqs, **done)
