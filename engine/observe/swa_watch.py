"""The SWA half of the in-flight watch (inflight_watch.py): the SWA slots each kept read of a
launched batch names, counted per slot — as read at launch, or as re-read through the row and
the full-to-SWA map after its row was written below its end — so that a release of a counted
slot (the SWA allocator's change feed) says a read may have lost one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from engine.mem.allocator import RELEASED, PageChange, SWAAllocator
from engine.request import Req

NONE = np.zeros(0, np.int64)


class WatchedBatch(Protocol):
    """A launched batch, per request: the request, its row and end, whether it is kept, and
    (hybrid pools) the SWA positions it reads with their slots at launch."""

    @property
    def reqs(self) -> list[Req]: ...
    @property
    def rows(self) -> np.ndarray: ...
    @property
    def ends(self) -> np.ndarray: ...
    @property
    def swa(self) -> list[tuple[np.ndarray, np.ndarray]]: ...

    kept: np.ndarray


class SWAWatch:
    """Per SWA slot, how many kept reads of the followed batches name it."""

    def __init__(self, alloc: SWAAllocator, table: np.ndarray) -> None:
        self.alloc, self.table, self.ps = alloc, table, alloc.page_size
        self.log = alloc.swa.changes.subscribe()
        self.held = np.zeros(alloc.swa.size + self.ps, np.int64)
        self.counted: dict[WatchedBatch, list[np.ndarray]] = {}  # per read, as counted

    def follow(self, batches: Sequence[WatchedBatch]) -> None:
        """Count each new batch's kept reads (as read at launch); uncount the dropped ones."""
        if len(self.counted) == len(batches) and all(b in self.counted for b in batches):
            return
        for gone in [b for b in self.counted if b not in batches]:
            for slots in self.counted.pop(gone):
                np.subtract.at(self.held, slots, 1)
        for batch in batches:
            if batch not in self.counted:
                kept = batch.kept.tolist()
                counted = [slots if k else NONE for (_, slots), k in zip(batch.swa, kept)]
                self.counted[batch] = counted
                np.add.at(self.held, np.concatenate([NONE, *counted]), 1)

    def drop(self, batch: WatchedBatch, reads: list[int]) -> None:
        counted = self.counted.get(batch, [])
        for i in reads if counted else ():
            np.subtract.at(self.held, counted[i], 1)
            counted[i] = NONE

    def released(self) -> np.ndarray | None:
        """The SWA slots released since the last call (None: the log was lost)."""
        changes, lost = self.log.take()
        return None if lost else slots_of(_released(changes), self.ps)

    def hit(self, released: np.ndarray | None) -> bool:
        """Whether a released slot is counted (True when the release log was lost)."""
        if released is None:
            return True
        return len(released) > 0 and bool(self.held[released].any())

    def recount_written(self, dirty: np.ndarray) -> None:
        """Recount, through the row and the map as they are now, the SWA slots of each read
        whose row was written below its end (``dirty``: per row, the first position)."""
        for batch, counted in self.counted.items():
            spans = zip(batch.rows.tolist(), batch.ends.tolist(), batch.swa)
            for i, (row, end, (positions, _)) in enumerate(spans):
                if len(counted[i]) and dirty[row] < end:
                    np.subtract.at(self.held, counted[i], 1)
                    swa = self.alloc.full_to_swa[self.table[row, positions].astype(np.int64)]
                    counted[i] = swa[swa > 0]
                    np.add.at(self.held, counted[i], 1)


def slots_of(pages: np.ndarray, page_size: int) -> np.ndarray:
    """Every slot of ``pages``."""
    if page_size == 1:
        return pages
    return (pages[:, None] * page_size + np.arange(page_size)).ravel()


def _released(changes: list[PageChange]) -> np.ndarray:
    pages = [p for p, sign in changes if sign == RELEASED]
    return np.concatenate(pages).astype(np.int64) if pages else NONE


__all__ = ["SWAWatch", "WatchedBatch", "slots_of"]
