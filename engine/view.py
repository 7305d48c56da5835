"""The state view: a frozen, plain-data snapshot of the engine that checkers read.

Keeps: the checker contract of docs/design.md decision 1 — invariants see only these records,
never engine objects. Counters (`PoolView.free` …) are the components' own counters; the
`Census` is computed separately from the actual index references, so the two can disagree.
Every field has a default so that hand-written fixtures may name only what they test.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, NamedTuple

from engine.view_blocks import BlockTableView, BlockView, InFlightView


@dataclass(frozen=True, slots=True)
class PageOwners:
    """One page and every owner that references it (witness of a census finding)."""

    page: int = 0
    owners: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Census:
    """Exact ownership census of one pool, by page id (page == slot when page_size is 1).

    duplicates: pages held twice — by two owners (tree nodes, rows, slots), or by one owner
                in two runs or in a run longer than a page.
    dangling:   pages a live owner references while they sit in the free list.
    orphans:    allocated pages nobody references (leaked).
    free_repeats: pages listed more than once in the free list (double free).
    """

    num_pages: int = 0
    taken: bool = True  # False: not computed for this view (no rule at this event reads it)
    duplicates: tuple[PageOwners, ...] = ()
    dangling: tuple[PageOwners, ...] = ()
    orphans: tuple[int, ...] = ()
    free_repeats: tuple[int, ...] = ()


# The ownership partition (docs/design.md §2): every slot of a pool is in exactly one of these.
POOL_BUCKETS: tuple[str, ...] = ("free", "evictable", "protected", "session_held", "request_owned")


@dataclass(frozen=True, slots=True)
class PoolView:
    """One KV pool ("full", or "swa" when hybrid); all sizes in tokens.

    `free … request_owned` are the SGLang counters: allocator available size, tree
    evictable/protected sizes, Σ held over idle session slots, Σ uncached over live rows.
    """

    name: str = "full"
    page_size: int = 1
    capacity: int = 0
    free: int = 0
    evictable: int = 0
    protected: int = 0
    session_held: int = 0
    request_owned: int = 0
    census: Census = field(default_factory=Census)
    sliding_window: int = 0  # the swa pool: the window its layers read back (0: full attention)


class NodeView(NamedTuple):
    """One radix-tree node. `lock_ref` is the full lock; SWA trees add the SWA fields.

    `parent_*lock_ref` (-1: not reported) are a target's copy of the parent's locks; kvspec's
    engine keeps each lock once, in its node's own view (a rule finds the parent by `parent`),
    so that a lock taken on a node does not rebuild the views of all its children. A
    NamedTuple like ReqView (built by the hundred per step when the tree churns)."""

    id: int = 0
    parent: int = -1  # -1 for the root only
    is_root: bool = False
    is_leaf: bool = True
    key_len: int = 0
    value_len: int = 0
    lock_ref: int = 0
    parent_lock_ref: int = -1
    swa_lock_ref: int = 0
    parent_swa_lock_ref: int = -1
    swa_tombstone: bool = False
    session_lock_ref: int = 0  # of lock_ref: the streaming sessions' turn-1 locks
    session_swa_lock_ref: int = 0  # of swa_lock_ref: the same locks' SWA part
    session_ref: int = 0  # session-radix tags: (session, frontier) pairs in this subtree
    session_ref_children: int = 0  # the sum of its children's session_ref, as they read now
    session_tags: tuple[str, ...] = ()  # the sessions this node is a frontier of


@dataclass(frozen=True, slots=True)
class TreeView:
    """The prefix cache: its own counters and its nodes (empty for the chunk cache)."""

    kind: str = "chunk"  # chunk | radix | swa_radix
    page_size: int = 1
    evictable_size: int = 0
    protected_size: int = 0
    swa_evictable_size: int = 0
    swa_protected_size: int = 0
    num_evictable_leaves: int = 0
    session_radix: bool = False  # sessions tag the tree (--enable-session-radix-cache)
    closed_sessions: tuple[str, ...] = ()  # session-radix closes remembered (SGLang's tombstones)
    nodes_taken: bool = True  # False: nodes not listed for this view (no rule reads them)
    nodes: tuple[NodeView, ...] = ()


class ReqView(NamedTuple):
    """A live request that owns (or is about to own) a request row.

    A NamedTuple, not a frozen dataclass like the other views: the engine builds it by the
    hundred per step, and ``tuple.__new__(ReqView, values)`` is ~8x cheaper than a slotted
    dataclass. It is a value all the same: immutable, hashable, equal by its fields (also to
    the plain tuple of them); ``record_fields``/``is_record`` treat it as any other view, and
    ``._replace`` stands in for ``dataclasses.replace``. The fields a ``Req`` holds under the
    same name and meaning come first (``REQ_COPIED``: the engine copies them in one call),
    then the derived ones."""

    rid: str = ""
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    cache_protected_len: int = 0
    swa_evicted_seqlen: int = 0
    is_chunked: int = 0
    kv_committed_freed: bool = False
    kv_overallocated_freed: bool = False
    is_retracted: bool = False  # retracted and not yet prefilled again
    req_pool_idx: int = -1  # -1: no row
    seq_len: int = 0  # len(fill_ids)
    origin_len: int = 0  # prompt tokens
    num_output: int = 0  # output tokens processed so far (overlap: the in-flight one not yet)
    finished: bool = False  # finished_reason set
    to_finish: bool = False  # an abort is pending (promoted at the next processed token)
    in_waiting: bool = False  # in the waiting queue
    in_running: bool = False  # in the running batch
    in_batch: bool = False  # in this iteration's batch (at ``step``: SGLang's last_batch)
    # EAGLE (engine/speculative/): the worker's (SGLang's GPU-side) view of the request
    spec_seq_len: int = -1  # verified KV length [0, spec_seq_len); -1: no speculative state
    spec_accept_len: int = 0  # the last verify's accepted drafts + 1 (the bonus)


# ReqView's leading fields, read from a Req as they are (same name, same meaning)
REQ_COPIED: tuple[str, ...] = ReqView._fields[: ReqView._fields.index("req_pool_idx")]


@dataclass(frozen=True, slots=True)
class ReleasedView:
    """One request released this iteration, as it stood just before ``release_kv_cache``:
    finished (``is_insert``: its KV goes to the cache) or retracted (freed)."""

    rid: str = ""
    req_pool_idx: int = -1
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    cache_protected_len: int = 0
    origin_len: int = 0
    num_output: int = 0
    is_insert: bool = True
    finished: bool = False
    finished_len: int = -1  # output tokens the API returns (finished requests); -1: unknown


@dataclass(frozen=True, slots=True)
class ReuseView:
    """A request that reached ``prepare_for_extend`` with its request row already set (a
    continuing chunk; SGLang's ``ReqToTokenPool.alloc`` reuse check)."""

    rid: str = ""
    req_pool_idx: int = -1
    is_chunked: int = 0
    kv_committed_len: int = 0


@dataclass(frozen=True, slots=True)
class IntegrityView:
    """One KV read of the last forward that did not find its fingerprint (the sim model's
    ``IntegrityFailure``): request, position, slot in ``pool`` (full | swa; 0 = unmapped)."""

    rid: str = ""
    position: int = 0
    slot: int = 0
    pool: str = "full"
    expected: int = 0
    found: int = 0


@dataclass(frozen=True, slots=True)
class ReqPoolView:
    """The request-row pool: `size` usable rows (row 0 is reserved)."""

    size: int = 0
    free_rows: tuple[int, ...] = ()
    rows_in_use: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SchedView:
    """The scheduler around the memory: queue sizes, the batch of this iteration, the chunk."""

    overlap: bool = False
    forward_ct: int = 0
    num_waiting: int = 0
    num_running: int = 0
    batch_mode: str = "idle"  # the batch of this iteration: idle | extend | decode | mixed
    batch_size: int = 0
    chunked_rids: tuple[str, ...] = ()  # requests whose chunked prefill is in flight (<= 1)
    new_token_ratio: float = 0.0
    batch_chunked_rids: tuple[str, ...] = ()  # requests of this batch prefilled only in part
    max_running_requests: int = 0  # 0: no limit known
    released: tuple[ReleasedView, ...] = ()  # released during this iteration, in order
    reuse: tuple[ReuseView, ...] = ()  # this batch's requests that arrived with a row
    spec_mode: str = "off"  # speculative decoding: off | v1 (EAGLE, no overlap) | v2 (overlap)
    num_draft_tokens: int = 0  # EAGLE: tokens one verify writes (root + num_steps drafts)
    spec_alloc_len: int = 0  # EAGLE: KV one decode step may allocate (get_alloc_len_per_decode)
    chunk_deferred: bool = False  # the in-flight chunk waits this round: the pool had no room
    # work waits, nothing runs or is in flight, and the wedge breaker could do nothing
    wedged: bool = False
    waiting_rids: tuple[str, ...] = ()  # the waiting queue, oldest first (named by sched.no_wedge)
    # overlap: reads of a launched, unprocessed batch, for a request whose result is kept,
    # whose slot is now free or unmapped (engine/observe/inflight.py), each named in words
    inflight_freed: tuple[str, ...] = ()
    # what this iteration's batch was decided on (the adder's charges plus the decode check it
    # passed, in tokens) and what preparing it took from each pool (engine/sched/estimate.py)
    estimated_tokens: int = 0
    allocated_tokens: tuple[int, ...] = ()  # full, then SWA; () where no estimate is kept
    preempted_unfreed: tuple[str, ...] = ()  # vllm: preempted, blocks held past the step


@dataclass(frozen=True, slots=True)
class SessionSlotView:
    """One streaming session's slot: the row that keeps its KV between turns."""

    session_id: str = ""
    req_pool_idx: int = -1
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    cache_protected_len: int = 0
    swa_evicted_seqlen: int = 0
    borrowed: bool = False  # an active request (running/last batch) holds the row now
    holds_lock: bool = False  # holds its turn-1 tree lock (on a non-root node)
    last_turn_len: int = -1  # tokens of the session's last successful turn (-1: none)
    restored_prefix_len: int = -1  # prefix_len of the last restore since the last save
    kv_checked: bool = False  # kv_mismatches computed (session and idle events, sim model)
    kv_mismatches: int = 0  # reads of [0, committed) (full and SWA) not finding the last turn's KV


@dataclass(frozen=True, slots=True)
class SessionView:
    """One open session."""

    session_id: str = ""
    streaming: bool = False
    inflight: bool = False  # a streaming turn is between create and finish/abort
    live_reqs: int = 0  # its unfinished requests in the scheduler
    close_on_finish: bool = False
    has_slot: bool = False
    num_req_nodes: int = 0


@dataclass(frozen=True, slots=True)
class ResponseView:
    """The API result of one finished request (``response`` event); the parent fields are the
    session's last successful response when this request was created."""

    rid: str = ""
    session_id: str = ""
    streaming: bool = False
    turn: int = 0  # 1-based among the session's requests (0: no session)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_type: str = ""  # length | stop | abort
    stop_token: int = -1  # the stop or EOS token that finished it (-1: none)
    min_new_tokens: int = 0  # asked for: no stop token before that many tokens
    status_code: int = 0  # of an abort (0: none)
    rejected: bool = False  # refused by the session controller
    appended_tokens: int = 0  # new input after the BOS strip
    parent_turn: int = 0  # 0: no successful turn before
    parent_prompt_tokens: int = 0
    parent_completion_tokens: int = 0
    cache_flushed: bool = False  # flush_cache dropped the slots since the parent
    output_ids: tuple[int, ...] = ()  # the tokens returned
    # the model's greedy tokens for the same prompt with nothing cached (built only when a
    # rule reads them; reference_checked False: the model offers no exact reference)
    reference_ids: tuple[int, ...] = ()
    reference_checked: bool = False


@dataclass(frozen=True, slots=True)
class CrashView:
    """The exception that ended an engine operation (the harness's ``crash`` event): its kind
    (accounting | out_of_memory | stall | exception), its class and message, the pages it
    names in pool ``pool`` where the raiser knew them, and (a real engine's) the ``site`` in
    the engine's code that raised it, ``path:function`` (what tells two crashes apart)."""

    kind: str = ""
    error: str = ""
    message: str = ""
    pool: str = ""
    pages: tuple[int, ...] = ()
    site: str = ""


@dataclass(frozen=True, slots=True)
class StateView:
    """Everything an invariant may read at one event."""

    event: str = "step"
    step: int = 0
    page_size: int = 1
    pools: tuple[PoolView, ...] = ()
    tree: TreeView = field(default_factory=TreeView)
    req_pool: ReqPoolView = field(default_factory=ReqPoolView)
    reqs: tuple[ReqView, ...] = ()
    sched: SchedView = field(default_factory=SchedView)
    integrity: tuple[IntegrityView, ...] = ()  # failed KV reads of this iteration's forward
    slots: tuple[SessionSlotView, ...] = ()  # streaming-session slots
    sessions: tuple[SessionView, ...] = ()
    response: ResponseView = field(default_factory=ResponseView)  # at the response event
    crash: tuple[CrashView, ...] = ()  # at the crash event: what the engine raised
    blocks: tuple[BlockView, ...] = ()  # a block-pool target's blocks (vllm), by id
    block_tables: tuple[BlockTableView, ...] = ()  # its requests' tables, per KV-cache group
    in_flight_blocks: tuple[InFlightView, ...] = ()  # what its unprocessed step reads (async)


# The costly parts of a view, built only for events whose rules read them: the census of
# every pool, the tree's node list and a response's uncached reference tokens (the checker
# derives which from its rules' attributes).
OPTIONAL_PARTS: frozenset[str] = frozenset({"census", "nodes", "reference_ids"})

# The sections of a view that cost a pass over requests, rows or the tree, or (sched) a
# read of the scheduler's state. A ``parts`` set holding SELECTIVE asks for only the
# sections it also names (the others keep their defaults, as no rule at that event reads
# them); without SELECTIVE every section is built.
SECTIONS: frozenset[str] = frozenset(
    {"pools", "tree", "req_pool", "reqs", "slots", "sessions", "sched"}
)
SELECTIVE = "selective"


def wanted_sections(parts: frozenset[str]) -> frozenset[str]:
    """The sections a ``parts`` set asks for (all of them without SELECTIVE)."""
    return SECTIONS & parts if SELECTIVE in parts else SECTIONS


VIEW_TYPES: tuple[type, ...] = (
    PageOwners,
    Census,
    PoolView,
    NodeView,
    TreeView,
    ReqView,
    ReleasedView,
    ReuseView,
    IntegrityView,
    ReqPoolView,
    SchedView,
    SessionSlotView,
    SessionView,
    ResponseView,
    CrashView,
    BlockView,
    BlockTableView,
    InFlightView,
    StateView,
)


def is_record(obj: Any) -> bool:
    """A view record or record class: a view dataclass, or a NamedTuple (ReqView)."""
    cls = obj if isinstance(obj, type) else type(obj)
    return is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields"))


def record_fields(obj: Any) -> tuple[str, ...]:
    """The field names, in order, of a view record or record class (see ``is_record``)."""
    cls: Any = obj if isinstance(obj, type) else type(obj)
    return cls._fields if issubclass(cls, tuple) else tuple(f.name for f in fields(cls))


def view_field_names() -> frozenset[str]:
    """Every attribute name an invariant expression may use."""
    return frozenset(name for cls in VIEW_TYPES for name in record_fields(cls))


def view_to_dict(obj: Any) -> Any:
    """Plain JSON-able data (dicts, lists, ints, strs) of a view or any part of it; every
    record (ReqView included) a mapping of field to value."""
    if is_record(obj):
        return {name: view_to_dict(getattr(obj, name)) for name in record_fields(obj)}
    if isinstance(obj, tuple):
        return [view_to_dict(x) for x in obj]
    return obj
