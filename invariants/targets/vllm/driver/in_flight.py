"""What the step in flight reads or writes under async scheduling: taken when vLLM schedules the
step (``step_reads``), listed by the views until its output is processed (``in_flight_views``).
Runs inside the vllm venv.

Keeps: a read is the slice of a request's table a group's forward reads, kept as the very block
objects the table held at schedule time. A view names the read's blocks by id — or, where the
request still owns them and its table in that group still holds those very objects at the same
places (one comparison by identity, at C speed), as a span of the real blocks the same view
sends for that table (``in_flight_spans``: kvspec's side slices its copy of the table; at block
size 1 a request's read is its whole table every step, thousands of ids a view). A span is
only sent where it names exactly the blocks read: a table changed since, or one with a null
block past its leading run, is sent by id. A read sent as spans is ``held``: its blocks are,
now, the ones its own table holds there. Under ``KVSPEC_CROSSCHECK`` every read is also sent by
id (``in_flight_check``), and kvspec's side compares.
"""

from __future__ import annotations

from itertools import filterfalse
from operator import attrgetter
from typing import NamedTuple

from census_deltas import CROSSCHECK

BLOCK_ID, IS_NULL = attrgetter("block_id"), attrgetter("is_null")
FIELDS = ("rid", "blocks", "live", "fenced", "held")  # a row's (kvspec's InFlightView)


class Slice(NamedTuple):
    """What one group's forward reads of one request: its table's ``[first, first + len)``."""

    manager: object
    first: int
    blocks: list  # the table's block objects there, at schedule time


class Read(NamedTuple):
    """One request's reads in the step scheduled, its preemption count then, its tokens."""

    rid: str
    slices: list[Slice]
    preemptions: int
    tokens: int


def step_reads(sched, scheduled: dict[str, int], lookahead: int) -> list[Read]:
    """What a scheduled step reads or writes, taken when it is scheduled: per request, the
    blocks of every group from the first its first token's attention reads (a sliding
    window's start, its attention chunk's) to the last its tokens and the proposer's
    ``lookahead`` drafts write (a Mamba group: its table's end), and its preemption count
    (a request preempted since no longer owns them), its tokens."""
    requests, out = sched.requests, []
    managers = sched.kv_cache_manager.coordinator.single_type_managers
    for rid, n in scheduled.items():
        request = requests[rid]
        end = request.num_computed_tokens + lookahead
        start = request.num_computed_tokens - n
        slices = []
        for m in managers:
            table, size = m.req_to_blocks.get(rid, ()), m.block_size
            first = _first_read(m, start) // size
            # a Mamba group writes its running state and its drafts' states into the table's
            # last 1 + num_speculative_blocks blocks (MambaManager.allocate_new_blocks)
            last = len(table) if is_mamba(m) else -(-end // size)
            slices.append(Slice(m, first, list(table[first:last])))
        out.append(Read(rid, slices, request.num_preemptions, n))
    return out


def _first_read(manager, start: int) -> int:
    """The first token a group's forward reads for a token at ``start``: a sliding window's
    first; 2 back for a Mamba group (it reads the last computed token's state: vLLM frees as a
    window of 2 would, ``MambaManager.get_num_skipped_tokens`` = computed - 1); its attention
    chunk's first; 0 for full attention (all)."""
    window, chunk = local_span(manager)
    window = 2 if is_mamba(manager) else window
    if window:
        return max(0, start - window + 1)
    return start // chunk * chunk if chunk else 0


def local_span(manager) -> tuple[int, int]:
    """A group's sliding window and attention chunk (0: none; both 0: full attention)."""
    window = getattr(manager, "sliding_window", None) or 0
    return window, getattr(manager, "attention_chunk_size", None) or 0


def is_mamba(manager) -> bool:
    return type(manager).__name__ == "MambaManager"


def in_flight_views(sched, reads: list[Read], leading: dict) -> dict:
    """The step in flight's reads as the view lists them: whether the request still owns them
    (live: not finished, not preempted since), whether the scheduler fences frees behind
    the step (vLLM's ``defer_block_free``: a consumer connector under async scheduling, whose
    loads are not ordered with the step's writes) and whether its table holds them there
    still (``held``: sent as spans). ``leading``: each table the view sends, by
    ``(group, rid)``, its count of leading null blocks (None: a null block past them)."""
    fenced = bool(getattr(sched, "defer_block_free", False))
    rows, spans = [], []
    for read in reads:
        request = sched.requests.get(read.rid)
        live = (
            request is not None
            and not request.is_finished()
            and request.num_preemptions == read.preemptions
        )
        spanned = _spans(read, leading) if live else None
        if spanned is not None:
            spans.append([len(rows), spanned])
        held = spanned is not None  # (its table holds the very blocks read, there)
        rows.append((read.rid, [] if held else ids(read), live, fenced, held))
    out = {"in_flight_rows": {"fields": FIELDS, "rows": rows}, "in_flight_spans": spans}
    if CROSSCHECK:
        out["in_flight_check"] = [ids(read) for read in reads]
    return out


def ids(read: Read) -> list[int]:
    """The real blocks a read names, by id, in group order."""
    out: list[int] = []
    for piece in read.slices:
        out += map(BLOCK_ID, filterfalse(IS_NULL, piece.blocks))  # (at C speed)
    return out


def _spans(read: Read, leading: dict) -> list[list] | None:
    """Each group's read as ``[group, start, stop]`` into the real blocks the view sends for
    the request's table there, or None where that would not be exactly the blocks read."""
    out = []
    for manager, first, blocks in read.slices:
        group = manager.kv_cache_group_id
        nulls = leading.get((group, read.rid))
        table = manager.req_to_blocks.get(read.rid)
        if nulls is None or table is None or table[first : first + len(blocks)] != blocks:
            return None  # (lists compare by identity first: the very blocks, at C speed)
        start, stop = max(first - nulls, 0), max(first + len(blocks) - nulls, 0)
        out.append([group, start, stop])
    return out
