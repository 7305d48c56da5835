"""vLLM's own writes to its blocks and to its hash map, recorded as they happen, so that a view
re-reads only the blocks whose record may have changed (pool_reads.py). Runs inside the vllm
venv.

Keeps: every write vLLM makes to a block's fields goes through the block's ``__setattr__``
(``KVCacheBlock`` is a plain dataclass: vLLM writes its fields by assignment, the free queue's
links included), and every change to the hash map through ``BlockHashToBlockMap.insert`` and
``pop`` (the only writers of its ``_cache``) — so a block none of them touched holds the record
it held, and a block whose ``next_free_block`` none of them wrote links to the block it linked
to: kvspec's side walks the free queue from the links (invariants/targets/vllm/free_queue.py;
a back link, ``prev_free_block``, is not recorded: the walk goes forward). Installed only while
a run views: the unchecked mode times vLLM as shipped. A release without these classes is read
in full at every view, as before.
"""

from __future__ import annotations

_SET = object.__setattr__


class Writes:
    """What vLLM wrote since the last ``take``: block ids (a record's fields; the free
    queue's links), and hash-map keys (the hooks add to the module's three sets, one
    recording at a time: the block hook runs on every field write vLLM makes, so it does no
    more than the add)."""

    def take(self) -> tuple[set[int], set[int], set]:
        """The writes so far, and a fresh start."""
        taken = set(_BLOCKS), set(_LINKED), set(_KEYS)
        for written in (_BLOCKS, _LINKED, _KEYS):
            written.clear()
        return taken


_BLOCKS: set[int] = set()  # the recording run's block ids written to a record's field
_LINKED: set[int] = set()  # ... to its next free-queue link (the fake head and tail: -1)
_KEYS: set = set()  # ... and hash-map keys
_ADD_BLOCK, _ADD_LINKED = _BLOCKS.add, _LINKED.add
_ORIGINAL: dict[str, tuple[type, object]] = {}  # a hooked name -> (its class, what it held)


def _block_setattr(block, name: str, value) -> None:
    _SET(block, name, value)
    if name == "next_free_block":  # (the queue is walked forward: a back link is not read)
        _ADD_LINKED(block.block_id)
    elif name != "prev_free_block":
        _ADD_BLOCK(block.block_id)  # block_id: the first field __init__ sets


def _map_insert(self, key, block) -> None:
    _ORIGINAL["insert"][1](self, key, block)  # type: ignore[operator]
    _KEYS.add(key)


def _map_pop(self, key, block_id):
    popped = _ORIGINAL["pop"][1](self, key, block_id)  # type: ignore[operator]
    _KEYS.add(key)
    return popped


def record() -> Writes | None:
    """Start recording (None: this release lacks the classes or the map's two writers; read
    everything)."""
    stop()
    try:
        from vllm.v1.core.block_pool import BlockHashToBlockMap
        from vllm.v1.core.kv_cache_utils import KVCacheBlock
    except ImportError:
        return None
    if not all(callable(BlockHashToBlockMap.__dict__.get(name)) for name in ("insert", "pop")):
        return None  # the map is written some other way here: read it whole
    for cls, name, hook in (
        (KVCacheBlock, "__setattr__", _block_setattr),
        (BlockHashToBlockMap, "insert", _map_insert),
        (BlockHashToBlockMap, "pop", _map_pop),
    ):
        _ORIGINAL[name] = (cls, cls.__dict__.get(name))
        setattr(cls, name, hook)
    writes = Writes()
    writes.take()  # (a fresh start)
    return writes


def stop() -> None:
    """Stop recording and put the classes back as vLLM defined them."""
    for name, (cls, original) in _ORIGINAL.items():
        if original is None:
            delattr(cls, name)
        else:
            setattr(cls, name, original)
    _ORIGINAL.clear()
