"""A launched batch is an owner of what it reads until its results are processed (overlap).

Under overlap scheduling batch N+1 is launched before batch N's results are processed, and the
scheduler prepares N+2 while N+1 still runs: on a GPU the forward of N+1 is still reading its
KV while the CPU frees and re-hands pages. Writes of the KV itself are ordered on the forward
stream (a page freed now and written by N+2 is written after N+1 read it); what is not ordered
is the index state the CPU changes under it: a free zeroes SGLang's full-to-SWA map and puts
the page back on the free list at once. So a read of N+1 is held while, through the row as it
is now, its position still names a live slot: a full page that is not free, and — where the
position had one at launch — an SWA slot still mapped and not free. A row re-pointed at the
radix tree's copy of the same tokens (an insert that frees duplicates) keeps its reads held.

What a batch reads, per request: the full pool ``[0, seq_len)`` (an EAGLE decode: the verify's
``[0, prefix_len + num_draft_tokens)``); the SWA pool the model's window ``[max(prefix_len -
window, 0), seq_len)`` (the sim model's ``swa_read_start``, independent of the engine's
cursor) from ``cache_protected_len`` on: below it the KV is the radix tree's, held by the
request's tree lock, whose window the tree rules judge (whether SGLang's lock, moved to the
new node at a chunk's checkpoint, must outlive the chunk still in flight is open). A request
that is finished or retracted by now, or on another row than at launch, has
its result dropped at processing (SGLang frees a finished request's tail while N+1 still runs):
its reads are no longer held.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.mem.allocator import PagedAllocator, SWAAllocator
from engine.memory import KVMemory
from engine.model.runner import ForwardBatch, ForwardMode
from engine.observe.crosscheck import cross_check, crosscheck_enabled
from engine.observe.inflight_watch import ReadWatch, is_kept
from engine.request import Req

MAX_NAMED = 8  # findings named per view (the rule's message lists them)
NONE = np.zeros(0, np.int64)


@dataclass(frozen=True, slots=True)
class _Read:
    """What one request of a launched batch reads: its row, the end of its full-pool read and
    the positions that had an SWA slot at launch (inside the model's window), with those slots."""

    req: Req
    row: int
    end: int
    swa_positions: np.ndarray
    swa_slots: np.ndarray


@dataclass(slots=True, eq=False)
class _Launched:
    """A launched batch's reads, as arrays (one entry per request; the watch reads them)."""

    number: int  # the forward's number (Scheduler.forward_ct)
    mode: ForwardMode
    reqs: list[Req]
    rows: np.ndarray
    ends: np.ndarray
    kept: np.ndarray  # the watch's: False once it saw the request's result dropped
    swa: list[tuple[np.ndarray, np.ndarray]]  # SWA positions read and their slots (hybrid)

    def read(self, i: int) -> _Read:
        positions, slots = self.swa[i] if self.swa else (NONE, NONE)
        return _Read(self.reqs[i], int(self.rows[i]), int(self.ends[i]), positions, slots)


class InFlightReads:
    """The reads of the launched, unprocessed batches, checked against the state now: by the
    exact check when the watch (inflight_watch.py) says a read may have lost its slot, or
    while the last check found one; both ways at every call in cross-check mode."""

    def __init__(self, mem: KVMemory, verify_tokens: int = 0) -> None:
        """``verify_tokens``: EAGLE's tokens per verify (0 without speculative decoding): a
        launched decode batch is then the verify over ``[prefix, prefix + verify_tokens)``."""
        self.mem, self.verify_tokens = mem, verify_tokens
        alloc = mem.allocator
        self.full: PagedAllocator = alloc.full if isinstance(alloc, SWAAllocator) else alloc
        self.swa = alloc if isinstance(alloc, SWAAllocator) else None
        self._launched: dict[ForwardBatch, _Launched] = {}  # hashed by identity (eq=False)
        self.watch = ReadWatch(mem)
        self.crosscheck = crosscheck_enabled()
        self._found: tuple[str, ...] = ()

    def update(
        self, in_flight: list[ForwardBatch], launched: ForwardBatch | None, number: int, when: str
    ) -> tuple[str, ...]:
        """Follow ``launched`` (forward number ``number``, at its forward event) from now; drop
        the processed batches; name each held read whose slot is gone (``when``: the event and
        iteration that sees it)."""
        followed = None
        if launched is not None and launched not in self._launched:
            followed = self._launched[launched] = self._record(launched, number)
        live = {*in_flight, launched}
        for fb in [fb for fb in self._launched if fb not in live]:
            del self._launched[fb]
        records = list(self._launched.values())
        suspect = self.watch.may_have_lost(records, followed)
        if suspect or self._found or self.crosscheck:
            found = self._check(records, when)
            if self.crosscheck and found and not suspect:
                cross_check("in-flight reads (the watch saw no loss)", (), found)
            self._found = found
        return self._found

    def _check(self, records: list[_Launched], when: str) -> tuple[str, ...]:
        """The exact check: every kept read's slots through its row now."""
        out: list[str] = []
        for record in records:
            out += self._lost_reads(record, when)
        return tuple(out[:MAX_NAMED])

    def _record(self, fb: ForwardBatch, number: int) -> _Launched:
        ends = fb.seq_lens
        if self.verify_tokens and fb.mode is ForwardMode.DECODE:
            ends = fb.prefix_lens + self.verify_tokens
        rows, ends = fb.req_pool_indices.astype(np.int64), ends.astype(np.int64)
        swa = [] if self.swa is None else self._swa_reads(fb, rows, ends)
        kept = np.ones(len(rows), bool)
        return _Launched(number, fb.mode, list(fb.reqs), rows, ends, kept, swa)

    def _swa_reads(
        self, fb: ForwardBatch, rows: np.ndarray, ends: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per request, the positions of its own part of the window (see the docstring) that
        had an SWA slot at launch (none at launch: none read), and those slots."""
        assert self.swa is not None
        window = self.mem.config.sliding_window or 0
        table, out = self.mem.req_to_token_pool.req_to_token, []
        for req, row, prefix, end in zip(
            fb.reqs, rows.tolist(), fb.prefix_lens.tolist(), ends.tolist()
        ):
            positions = np.arange(max(prefix - window, req.cache_protected_len, 0), end)
            swa = self.swa.full_to_swa[table[row, positions].astype(np.int64)]
            out.append((positions[swa > 0], swa[swa > 0]))
        return out

    def _lost_reads(self, record: _Launched, when: str) -> list[str]:
        out = []
        for i in range(len(record.reqs)):
            read = record.read(i)
            if not is_kept(read.req, read.row):  # (the watch's own mask is not consulted)
                continue
            for pool, position, slot in self._gone(read):
                freer = _freer(read.req, pool, position)
                out.append(
                    f"launched batch #{record.number} ({record.mode.value}) reads {pool} slot "
                    f"{slot} (position {position}) for {read.req.rid}, {freer}, seen at {when} "
                    "before the batch was processed"
                )
        return out

    def _gone(self, read: _Read) -> list[tuple[str, int, int]]:
        """The first position per pool whose slot, through the row now, is free or unmapped (an
        SWA slot is named as it was at launch: an unmapped one reads as 0 now)."""
        ps, table = self.mem.page_size, self.mem.req_to_token_pool.req_to_token
        slots = table[read.row, : read.end].astype(np.int64)
        gone = []
        free = np.flatnonzero(self.full.is_free(slots // ps))
        if len(free):
            gone.append(("full", int(free[0]), int(slots[free[0]])))
        if self.swa is not None and len(read.swa_positions):
            swa = self.swa.full_to_swa[slots[read.swa_positions]]
            lost = np.flatnonzero((swa <= 0) | self.swa.swa.is_free(swa // ps))
            if len(lost):
                at = lost[0]
                gone.append(("swa", int(read.swa_positions[at]), int(read.swa_slots[at])))
        return gone


def _freer(req: Req, pool: str, position: int) -> str:
    """Who gave the slot back, as far as the state says: the request's own window slide (its
    cursor passed the position) or another owner (the tree's eviction, an insert, a free)."""
    if pool == "swa" and position < req.swa_evicted_seqlen:
        return f"freed by its own window slide (swa_evicted_seqlen={req.swa_evicted_seqlen})"
    return "freed by another owner (the tree, an insert or a release)"


__all__ = ["InFlightReads"]
