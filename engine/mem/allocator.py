"""KV slot allocators: token (page 1), paged (whole-page frees) and SWA hybrid.

Keeps: every page id in ``1..num_pages`` is either in the free list exactly once or handed
out; page 0 (slots ``[0, page_size)``) is reserved as the padding write target.

Free-list order (SGLang's ``need_sort`` mode): allocation takes the lowest ids of the sorted
``free_pages``; freed pages go to ``release_pages`` and are merged and re-sorted into
``free_pages`` only when an allocation cannot be served without them. So a freed page is not
reused while never-used pages remain — deterministic, and what page-id scenario tests pin.

Change feed (``changes``, engine/mem/feed.py): every page taken off the free list is
published as ``(pages, TAKEN)``, every page returned as ``(pages, RELEASED)``, in order; a
``clear`` resets the feed; a merge publishes nothing (the free set is unchanged). Published
arrays are never written afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.errors import KVAccountingError
from engine.mem import paging
from engine.mem.feed import ChangeFeed

IndexArray = np.ndarray  # int64 slot ids
TAKEN, RELEASED = -1, 1  # a published change: (pages, TAKEN) or (pages, RELEASED)
PageChange = tuple[IndexArray, int]


class PagedAllocator:
    """Hands out KV slots a page at a time; ``free`` releases every page it touches.

    Freeing any slot of a page frees the whole page (as SGLang does): a partial-page free
    of a page that still holds committed KV corrupts live KV. Strict mode raises on double
    and out-of-range frees; non-strict mode corrupts silently, as SGLang would.
    """

    def __init__(
        self, size: int, page_size: int, *, strict: bool = True, name: str = "full"
    ) -> None:
        if page_size < 1 or size < page_size:
            raise KVAccountingError(
                f"allocator needs size >= page_size >= 1, got {size=}, {page_size=}"
            )
        self.page_size = page_size
        self.num_pages = size // page_size
        self.size = self.num_pages * page_size  # capacity in tokens (max_total_num_tokens)
        self.strict, self.name = strict, name  # name: the pool's, in errors ("full", "swa")
        self._offsets = np.arange(page_size, dtype=np.int64)
        self.changes: ChangeFeed[PageChange] = ChangeFeed()
        self.taken_tokens = 0  # every page ever taken, in tokens (sched/estimate.py reads it)
        self.clear()

    def clear(self) -> None:
        self.free_pages: IndexArray = _frozen(np.arange(1, self.num_pages + 1, dtype=np.int64))
        self.release_pages: list[IndexArray] = []
        self._num_released = 0
        self._is_free = np.ones(self.num_pages + 1, dtype=bool)
        self._is_free[0] = False
        self.changes.reset()

    def available_size(self) -> int:
        """Free capacity in tokens (free and released pages)."""
        return (len(self.free_pages) + self._num_released) * self.page_size

    def merge_and_sort_free(self) -> None:
        if self.release_pages:
            self.free_pages = _frozen(
                np.sort(np.concatenate([self.free_pages, *self.release_pages]))
            )
            self.release_pages = []
            self._num_released = 0

    def all_free_pages(self) -> IndexArray:
        """The free list as it is, released pages included (for the census)."""
        return np.concatenate([self.free_pages, *self.release_pages])

    def take_pages(self, count: int) -> IndexArray | None:
        """The ``count`` lowest free pages, or None (nothing taken) if there are fewer."""
        if count > len(self.free_pages):
            self.merge_and_sort_free()
            if count > len(self.free_pages):
                return None
        pages, self.free_pages = self.free_pages[:count], self.free_pages[count:]
        self._is_free[pages] = False
        self.taken_tokens += count * self.page_size
        if count:
            self.changes.publish((pages, TAKEN))
        return pages

    def pages_to_slots(self, pages: IndexArray) -> IndexArray:
        return (pages[:, None] * self.page_size + self._offsets).ravel()

    def alloc(self, need_size: int) -> IndexArray | None:
        """``need_size`` slots (a page multiple) on fresh pages, or None."""
        if need_size % self.page_size:
            raise KVAccountingError(
                f"alloc of {need_size} tokens is not page aligned (page_size {self.page_size})"
            )
        pages = self.take_pages(need_size // self.page_size)
        return None if pages is None else self.pages_to_slots(pages)

    def alloc_extend(
        self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_locs: Sequence[int]
    ) -> IndexArray | None:
        """Slots for positions ``[prefix_len, seq_len)`` of each request, concatenated.

            [prefix_len, ceil(prefix_len))   the rest of the prefix's last page: last_loc+1 …
            [ceil(prefix_len), seq_len)      fresh pages, in request order
        All-or-nothing: None (nothing taken) if the fresh pages are not available.
        """
        ps = self.page_size
        fresh = [paging.num_new_pages(p, s, ps) for p, s in zip(prefix_lens, seq_lens)]
        pages = self.take_pages(sum(fresh))
        if pages is None:
            return None
        parts, cursor = [], 0
        for prefix, seq, last, count in zip(prefix_lens, seq_lens, last_locs, fresh):
            in_page = min(seq - prefix, paging.ceil_align(prefix, ps) - prefix)
            if in_page:
                parts.append(np.arange(last + 1, last + 1 + in_page, dtype=np.int64))
            slots = self.pages_to_slots(pages[cursor : cursor + count])
            parts.append(slots[: seq - prefix - in_page])
            cursor += count
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def alloc_decode(self, seq_lens: Sequence[int], last_locs: Sequence[int]) -> IndexArray | None:
        """One slot per request for position ``seq_len - 1`` (``seq_len`` counted after the +1):
        ``last_loc + 1`` unless that position opens a new page. None if pages run out."""
        seq = np.asarray(seq_lens, dtype=np.int64)
        out = np.asarray(last_locs, dtype=np.int64) + 1
        opens = (seq - 1) % self.page_size == 0
        pages = self.take_pages(int(opens.sum()))
        if pages is None:
            return None
        out[opens] = pages * self.page_size
        return out

    def free(self, indices: IndexArray) -> None:
        """Return every page that any of ``indices`` lies in to the release list."""
        if len(indices) == 0:
            return
        pages = np.unique(np.asarray(indices, dtype=np.int64) // self.page_size)
        if self.strict:
            self._check_free(pages, np.asarray(indices))
        self._is_free[pages] = True
        self.release_pages.append(_frozen(pages))
        self._num_released += len(pages)
        self.changes.publish((pages, RELEASED))

    def _check_free(self, pages: IndexArray, indices: IndexArray) -> None:
        bad = pages[(pages < 1) | (pages > self.num_pages)]
        if len(bad):
            raise KVAccountingError(
                f"{self.name}: free of out-of-range page(s) {bad[:8].tolist()} "
                f"(valid 1..{self.num_pages})",
                pool=self.name,
                pages=tuple(bad.tolist()),
            )
        again = pages[self._is_free[pages]]
        if len(again):
            raise KVAccountingError(
                f"{self.name}: double free of page(s) {again[:8].tolist()}",
                pool=self.name,
                pages=tuple(again.tolist()),
            )
        if self.page_size == 1 and len(pages) != len(indices):
            raise KVAccountingError("double free: a slot appears twice in one free call")

    def is_free(self, pages: IndexArray) -> np.ndarray:
        return self._is_free[pages]


def _frozen(pages: IndexArray) -> IndexArray:
    """The free list's arrays are never written in place (only sliced, appended, replaced):
    the pages published to the change feed are views of them."""
    pages.setflags(write=False)
    return pages


class TokenAllocator(PagedAllocator):
    """The page-size-1 allocator: a page is one KV slot."""

    def __init__(self, size: int, *, strict: bool = True) -> None:
        super().__init__(size, 1, strict=strict)

    def pages_to_slots(self, pages: IndexArray) -> IndexArray:
        return pages


class SWAAllocator:
    """Hybrid allocator: a full-attention pool and a sliding-window pool allocated together.

    ``full_to_swa[full_slot]`` is the SWA slot holding the same position (0 = none).
    ``free`` releases full pages and their SWA slots; ``free_swa`` only the SWA slots (what
    SWA eviction does), zeroing the mapping.
    """

    def __init__(self, size: int, size_swa: int, page_size: int, *, strict: bool = True) -> None:
        self.page_size = page_size
        self.full = PagedAllocator(size, page_size, strict=strict)
        self.swa = PagedAllocator(size_swa, page_size, strict=strict, name="swa")
        self.size, self.size_swa = self.full.size, self.swa.size
        self.full_to_swa = np.zeros(self.size + page_size, dtype=np.int64)

    def clear(self) -> None:
        self.full.clear()
        self.swa.clear()
        self.full_to_swa[:] = 0

    def available_size(self) -> int:
        return min(self.full.available_size(), self.swa.available_size())

    def full_available_size(self) -> int:
        return self.full.available_size()

    def swa_available_size(self) -> int:
        return self.swa.available_size()

    def translate_to_swa(self, full_indices: IndexArray) -> IndexArray:
        return self.full_to_swa[full_indices]

    def alloc(self, need_size: int) -> IndexArray | None:
        if need_size > self.available_size():
            return None
        full, swa = self.full.alloc(need_size), self.swa.alloc(need_size)
        assert full is not None and swa is not None  # both had room: available_size is the min
        self.full_to_swa[full] = swa
        return full

    def alloc_extend(
        self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_locs: Sequence[int]
    ) -> IndexArray | None:
        ps = self.page_size
        need = sum(paging.num_new_pages(p, s, ps) for p, s in zip(prefix_lens, seq_lens)) * ps
        if need > self.available_size():
            return None
        full = self.full.alloc_extend(prefix_lens, seq_lens, last_locs)
        swa = self.swa.alloc_extend(prefix_lens, seq_lens, self._swa_last_locs(last_locs))
        assert full is not None and swa is not None  # both had room: available_size is the min
        self.full_to_swa[full] = swa
        return full

    def alloc_decode(self, seq_lens: Sequence[int], last_locs: Sequence[int]) -> IndexArray | None:
        opens = sum(1 for s in seq_lens if paging.decode_needs_page(s, self.page_size))
        if opens * self.page_size > self.available_size():
            return None
        full = self.full.alloc_decode(seq_lens, last_locs)
        swa = self.swa.alloc_decode(seq_lens, self._swa_last_locs(last_locs))
        assert full is not None and swa is not None  # both had room: available_size is the min
        self.full_to_swa[full] = swa
        return full

    def _swa_last_locs(self, last_locs: Sequence[int]) -> list[int]:
        return [int(self.full_to_swa[loc]) if loc >= 0 else -1 for loc in last_locs]

    def free(self, indices: IndexArray) -> None:
        if len(indices) == 0:
            return
        self.full.free(indices)
        self.free_swa(indices)

    def free_swa(self, indices: IndexArray) -> None:
        swa = self.full_to_swa[indices]
        self.swa.free(swa[swa > 0])
        self.full_to_swa[indices] = 0
