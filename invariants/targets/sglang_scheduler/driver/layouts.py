"""Where the state the reader needs lives in a release, one reader per probe answer
(probes.py): a request's KV record, a streaming session's slot, the radix tree's nodes, the
free pages, a session's in-flight state. Every era's adapter reads through these.

Keeps: each reader returns what reader.py expects whatever the layout — a KV record is an
object with ``req_pool_idx``, ``kv_committed_len``, ``kv_allocated_len`` and
``cache_protected_len``, the same object each time for the same owner (the reader tells
owners apart by identity); a slot is (its record, the id of the non-root node its turn-1 tree
lock holds, or None). Nothing is written back. Runs inside the sglang venv; imports nothing
of kvspec.
"""

from __future__ import annotations

import os

import torch
from reader import live_requests, trace_rid

CROSSCHECK = os.environ.get("KVSPEC_CROSSCHECK", "") not in ("", "0")


class SplitRecord:
    """A KV record whose allocated length lives apart, on ``owner.kv`` (a ``ReqKvInfo``
    holding ``kv_allocated_len`` only; None while no row is held), the rest on the owner (a
    request, or a session slot)."""

    __slots__ = ("owner",)

    def __init__(self, owner) -> None:
        self.owner = owner

    @property
    def req_pool_idx(self):
        owner = self.owner
        return owner.req_pool_idx if owner.kv is not None else None

    @property
    def kv_committed_len(self) -> int:
        return self.owner.kv_committed_len

    @property
    def kv_allocated_len(self) -> int:
        kv = self.owner.kv
        return 0 if kv is None else kv.kv_allocated_len

    @property
    def cache_protected_len(self) -> int:
        return self.owner.cache_protected_len


class KvRecords:
    """A request's KV record by the ``req_kv`` probe: the request itself (``flat``), its
    ``kv`` (``record``) or a ``SplitRecord`` kept per request (``split``: one object per
    owner, so identity holds across a view)."""

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.split: dict[int, tuple[object, SplitRecord]] = {}  # id(owner) -> (owner, record)

    def __call__(self, owner):
        if self.layout == "flat":
            return owner
        if self.layout == "record":
            return owner.kv
        kept = self.split.get(id(owner))
        if kept is None or kept[0] is not owner:
            kept = self.split[id(owner)] = (owner, SplitRecord(owner))
        return kept[1]


def lock_id(node):
    """The id of the node a tree lock holds: a unified tree core hands out node ids (ints)
    themselves; a node object's id, None for the root or a slot's stand-in node (which has
    no parent); None for no lock."""
    if isinstance(node, int):
        return node
    if node is None or getattr(node, "parent", None) is None:
        return None
    return node.id


def session_slots(scheduler, layout: str, records: KvRecords, refused: frozenset) -> dict:
    """Session id -> (its KV record, the id of the node its turn-1 tree lock holds, or None).

    ``lock`` and ``moved``: a turn runs on its slot's record itself (the same object), so
    ``refused`` plays no part. ``flat`` and ``split``: a slot copies a turn's fields at finish
    and back at the next turn's match; a slot whose row an accepted live turn shares has that
    turn's record (the turn's lengths are the row's); a request its session refused is never
    the slot's turn, even when the release restores the slot into it (then both own the row,
    and the census says so)."""
    tree = scheduler.tree_cache
    slots = getattr(getattr(tree, "session", tree), "slots", None) or {}
    if layout == "lock":
        return {
            sid: (slot.kv, None if slot.lock is None else lock_id(slot.lock.node))
            for sid, slot in slots.items()
        }
    if layout == "moved":
        return {sid: (slot.kv, lock_id(slot.last_node)) for sid, slot in slots.items()}
    live = [r for r in live_requests(scheduler) if trace_rid(r) not in refused]
    found = {}
    for sid, slot in slots.items():
        record = records(slot)
        turns = [
            r for r in live if _turn_of(r, sid) and records(r).req_pool_idx == slot.req_pool_idx
        ]
        if turns and record.req_pool_idx is not None:
            record = records(turns[0])
        found[sid] = (record, lock_id(slot.last_node))
    return found


def _turn_of(req, session_id: str) -> bool:
    session = getattr(req, "session", None)
    return session is not None and session.streaming and session.session_id == session_id


def session_state(session, live: list, flags: str) -> tuple[bool, bool]:
    """(a streaming turn is in flight, the close waits for it). ``flags``: the session's own
    ``_inflight`` and ``close_on_finish``. ``liveness`` (no flags): a turn is in flight while
    the session's last request is still held by the scheduler (``live``: the session's
    unfinished requests there; a turn aborted from the waiting queue never finishes, yet the
    release takes the next turn), and a close never waits."""
    if flags == "flags":
        return bool(session._inflight), bool(session.close_on_finish)
    last = [node.req for node in session.req_nodes.values()]
    return session.streaming and any(req in live for req in last), False


def tree_nodes(scheduler) -> list:
    """(id, parent id or -1, key length, value slots, lock_ref) of every node, root first;
    empty for a cache without a tree (the chunk cache). A unified cache keeps its nodes in a
    ``tree_core`` (or under its own root) with the full pool's part at ``component_data[0]``
    (``ComponentType.FULL``); a radix cache (maybe wrapped, ``.inner``) under ``root_node``."""
    tree = scheduler.tree_cache
    core = getattr(tree, "tree_core", None)
    if core is not None:
        root = getattr(core, "root_node", None)
        if root is None:  # the Rust core: its nodes cannot be listed
            raise AttributeError(f"{type(core).__name__} has no root_node to list nodes from")
    else:
        root = getattr(getattr(tree, "inner", tree), "root_node", None)
    if root is None:
        return []
    unified = hasattr(root, "component_data")
    found, stack, values = [], [root], NODE_VALUES
    while stack:
        node = stack.pop()
        data = node.component_data[0] if unified else node
        value = values.slots(data.value)
        parent = -1 if node.parent is None else node.parent.id
        key_len = 0 if node.key is None else len(node.key)
        lock = data.full_lock_ref if hasattr(data, "full_lock_ref") else data.lock_ref  # SWA
        found.append((node.id, parent, key_len, value, lock))
        stack.extend(node.children.values())
    values.forget_the_rest()
    return found


class NodeValues:
    """The slots of each node value tensor read at the last view, by the tensor: SGLang gives
    a node a new value tensor when it changes it (a split slices, an eviction drops), never
    writes one in place — so a tensor already read reads the same, and a view converts only
    the values that are new (under ``KVSPEC_CROSSCHECK`` every value is read again and must
    agree)."""

    def __init__(self) -> None:
        self.kept: dict[int, tuple[object, list[int]]] = {}  # id(tensor) -> (tensor, slots)
        self.seen: dict[int, tuple[object, list[int]]] = {}

    def slots(self, value) -> list[int]:
        if value is None:
            return []
        if not isinstance(value, torch.Tensor):  # (a list could change in place: read it)
            return torch.as_tensor(value).long().tolist()
        key = id(value)
        entry = self.kept.get(key) or self.seen.get(key)
        if entry is None or entry[0] is not value:
            entry = (value, torch.as_tensor(value).long().tolist())
        elif CROSSCHECK and entry[1] != torch.as_tensor(value).long().tolist():
            raise AssertionError(f"a node value tensor changed in place: {entry[1][:8]}...")
        self.seen[key] = entry  # (the tensor kept alive: its id is not reused while here)
        return entry[1]

    def forget_the_rest(self) -> None:
        """Keep only the values this view read."""
        self.kept, self.seen = self.seen, {}


NODE_VALUES = NodeValues()  # (one scheduler per trace's child)


def fill_len(req, source: str) -> int:
    """Tokens of the request's current fill; ``source``: the fill probe's answer. An
    unset ``extend_range`` reads as the whole fill, as a release with ``extend_end`` slices."""
    if source == "extend_range":
        end = None if req.extend_range is None else req.extend_range.end
        return len(req.full_untruncated_fill_ids[:end])
    return len(req.get_fill_ids() if source == "get_fill_ids" else req.fill_ids)


def free_pages(allocator, source: str) -> list[int]:
    """Free page ids (with page size 1, the free slots), the release list included."""
    if source == "get_all_free_pages":
        return allocator.get_all_free_pages().long().tolist()
    return torch.cat((allocator.free_pages, allocator.release_pages)).long().tolist()
