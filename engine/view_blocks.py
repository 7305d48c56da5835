"""The view records of a block-pool engine (the vllm target; kvspec's engine lists none): one
per KV block and one per request's block table in each KV-cache group. Part of the view
schema of engine/view.py, which lists them among its record types.
"""

from __future__ import annotations

from typing import NamedTuple


class BlockView(NamedTuple):
    """One KV block of a block-pool engine (the vllm target; kvspec's engine lists none): its
    reference count, whether it sits in the free queue, its prefix-cache hash (empty: none),
    the hashes under which the cache's hash map lists it, and how many request block tables
    list it."""

    id: int = 0
    ref_cnt: int = 0
    in_free_queue: bool = False
    hash: str = ""
    mapped_as: tuple[str, ...] = ()
    holders: int = 0
    is_null: bool = False


class BlockTableView(NamedTuple):
    """One request's block table in one KV-cache group of a block-pool engine (the vllm
    target): the group's sliding window and attention chunk (chunked-local attention; both 0:
    full attention), the tokens computed (those of a step scheduled but not yet processed
    included: ``in_flight``, async scheduling), the group's block size, how many blocks the
    table lists and which of them are the null block (a sliding window drops blocks that lie
    wholly before it, an attention chunk those before the chunk); ``kind``: attention, or
    mamba (a state group: a block for each state it keeps, the rest null; ``spec_blocks``:
    the blocks past its running state where speculative decoding writes the drafts'
    states)."""

    rid: str = ""
    group: str = ""
    window: int = 0
    chunk: int = 0
    computed: int = 0
    in_flight: int = 0
    block_size: int = 1
    num_blocks: int = 0
    null_blocks: tuple[int, ...] = ()
    kind: str = "attention"
    spec_blocks: int = 0


class InFlightView(NamedTuple):
    """What the step scheduled but not yet processed (async scheduling) reads or writes for
    one request: its blocks over every KV-cache group (the null block left out), whether the
    request still owns them (``live``: not finished, not preempted since the step was
    scheduled) and whether the engine fences frees behind the step (``fenced``: vLLM's
    ``defer_block_free``, on with a consumer KV connector, whose loads are not ordered with
    the step's writes), and whether they are, now, the very blocks its own table holds at
    the places the step read them (``held``: each then has a holder)."""

    rid: str = ""
    blocks: tuple[int, ...] = ()
    live: bool = False
    fenced: bool = False
    held: bool = False
