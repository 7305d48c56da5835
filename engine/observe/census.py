"""The exact ownership census of one KV pool: who references each page, by page id.

Keeps nothing itself: it is the independent witness of the ownership law (docs/design.md §2).
Counters can balance while a page is owned twice and another is leaked; this cannot,
because it counts the page ids every owner actually references.

An owner lists one page id per slot it holds, so a page's slots are a run of equal ids:
a run of at most ``slots_per_page`` entries is one holding. A page is a duplicate when it
is held twice — by two owners, in two separate runs of one owner, or by a run longer than
a page has slots (at page size 1 a slot listed twice in a row).

Cost: one concatenation of every owner's pages and a few byte masks over the pool; the
per-page holdings and the owner names are computed only on a failing state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.view import Census, PageOwners

PageRefs = tuple[str, np.ndarray]  # (owner label, page ids; repeats allowed)
MAX_WITNESSES = 8
_EMPTY = np.empty(0, dtype=np.int64)


def take_census(
    num_pages: int,
    free_pages: np.ndarray,
    owned: Sequence[PageRefs],
    referenced: Sequence[PageRefs] = (),
    *,
    slots_per_page: int,
) -> Census:
    """Census of pages ``1..num_pages``.

    owned:          each owner's pages, one id per slot held (tree nodes, rows, session slots).
    referenced:     pages live rows read (their whole ``[0, allocated)`` range); reading a
                    free page is dangling even when the page is owned by the tree.
    slots_per_page: the page size the ids were taken at (1 when they are slot ids): how many
                    equal ids in a row one holding of a page may list.
    """
    owned = [(label, pages) for label, pages in owned if len(pages)]
    referenced = [(label, pages) for label, pages in referenced if len(pages)]
    own = _flatten(owned, slots_per_page)
    ref = _flatten(referenced, slots_per_page)
    ids = [a for a in (own, ref, free_pages) if len(a)]
    top = max([num_pages, *(int(a.max()) for a in ids)])
    free = np.zeros(top + 1, dtype=bool)
    free[free_pages] = True
    repeats = np.count_nonzero(free) != len(free_pages)
    if top > num_pages or any(int(a.min()) < 1 for a in ids) or repeats:
        return _census_by_histogram(
            num_pages, top + 1, free_pages, owned, referenced, own, ref, slots_per_page
        )
    return _census_in_range(num_pages, free, owned, referenced, own, ref, slots_per_page)


def _census_in_range(
    num_pages: int,
    free: np.ndarray,
    owned: Sequence[PageRefs],
    referenced: Sequence[PageRefs],
    own: np.ndarray,
    ref: np.ndarray,
    slots_per_page: int,
) -> Census:
    """The common path: every id in ``1..num_pages`` and no page listed twice as free
    (``free``: the free pages as a mask)."""
    held = np.zeros(len(free), dtype=bool)
    held[own] = True
    live = held.copy()
    live[ref] = True
    free[0] = True  # page 0 is reserved: never an orphan
    twice = len(own) > np.count_nonzero(held)  # some page has two entries: it is held twice
    return Census(
        num_pages=num_pages,
        duplicates=_duplicates(owned, slots_per_page) if twice else (),
        dangling=_witnesses(np.flatnonzero(live & free), [*owned, *referenced], "free"),
        orphans=tuple(np.flatnonzero(~(free | held))[:MAX_WITNESSES].tolist()),
    )


def _census_by_histogram(
    num_pages: int,
    size: int,
    free_pages: np.ndarray,
    owned: Sequence[PageRefs],
    referenced: Sequence[PageRefs],
    own: np.ndarray,
    ref: np.ndarray,
    slots_per_page: int,
) -> Census:
    """The general path, for free lists with repeats or ids out of range (a broken state)."""
    free_count = np.bincount(free_pages, minlength=size)
    own_count = np.bincount(own, minlength=size)
    live = own_count > 0
    live[ref] = True
    orphans = np.flatnonzero((free_count == 0) & (own_count == 0))
    return Census(
        num_pages=num_pages,
        duplicates=_duplicates(owned, slots_per_page) if (own_count >= 2).any() else (),
        dangling=_witnesses(np.flatnonzero(live & (free_count > 0)), [*owned, *referenced], "free"),
        orphans=tuple(orphans[(orphans >= 1) & (orphans <= num_pages)][:MAX_WITNESSES].tolist()),
        free_repeats=tuple(np.flatnonzero(free_count >= 2)[:MAX_WITNESSES].tolist()),
    )


def holding_mask(pages: np.ndarray, slots_per_page: int, owner_starts: np.ndarray) -> np.ndarray:
    """Which of ``pages`` (owners' page lists concatenated, one starting at each of
    ``owner_starts``) to keep so that a page keeps two entries exactly when it is held twice:
    the first of each run of equal ids, and every id equal to the one ``slots_per_page``
    before it (a run longer than one page's slots, or the same page again in another run)."""
    keep = np.ones(len(pages), dtype=bool)
    if slots_per_page > 1:
        keep[1:] = pages[1:] != pages[:-1]
        keep[slots_per_page:] |= pages[slots_per_page:] == pages[:-slots_per_page]
        keep[owner_starts[owner_starts < len(pages)]] = True
    return keep


def _flatten(refs: Sequence[PageRefs], slots_per_page: int) -> np.ndarray:
    """Every owner's pages concatenated, one entry per holding (``holding_mask``) — and
    at page size 1, where every entry is a holding, as they are (no mask to compute)."""
    if not refs:
        return _EMPTY
    pages = np.concatenate([p for _, p in refs]).astype(np.int64, copy=False)
    if slots_per_page == 1:
        return pages
    starts = np.cumsum([0, *(len(p) for _, p in refs[:-1])])
    return pages[holding_mask(pages, slots_per_page, starts)]


def _duplicates(owned: Sequence[PageRefs], slots_per_page: int) -> tuple[PageOwners, ...]:
    """The first pages held twice, each with its owners; an owner holding it more than once
    is named with how often (``req:r3@row0 (twice)``). Only computed on a failing state."""
    pages = np.concatenate([p for _, p in owned]).astype(np.int64, copy=False)
    owner = np.repeat(np.arange(len(owned)), [len(p) for _, p in owned])
    run = np.ones(len(pages), dtype=bool)
    run[1:] = (pages[1:] != pages[:-1]) | (owner[1:] != owner[:-1])
    at = np.flatnonzero(run)
    times = -(-np.diff(np.append(at, len(pages))) // slots_per_page)  # a run holds ceil(len / page)
    pairs, which = np.unique(np.stack([pages[at], owner[at]]), axis=1, return_inverse=True)
    held = np.bincount(which.ravel(), weights=times).astype(np.int64)
    page_ids, per_page = np.unique(pairs[0], return_inverse=True)
    total = np.bincount(per_page.ravel(), weights=held)
    found = []
    for page in page_ids[total >= 2][:MAX_WITNESSES].tolist():
        counts: dict[str, int] = {}
        for index in np.flatnonzero(pairs[0] == page).tolist():
            label = owned[int(pairs[1, index])][0]
            counts[label] = counts.get(label, 0) + int(held[index])
        found.append(
            PageOwners(page, tuple(owner_name(label, counts[label]) for label in sorted(counts)))
        )
    return tuple(found)


def owner_name(label: str, times: int) -> str:
    """An owner as a duplicate's witness names it: with how often it holds the page."""
    return label if times == 1 else f"{label} (twice)" if times == 2 else f"{label} ({times} times)"


def _witnesses(
    pages: np.ndarray, refs: Sequence[PageRefs], extra: str | None = None
) -> tuple[PageOwners, ...]:
    """Name the owners of the first few offending pages (only computed when there are any)."""
    found = []
    for page in pages[:MAX_WITNESSES].tolist():
        owners = sorted({label for label, held in refs if bool(np.any(held == page))})
        found.append(PageOwners(page, tuple(([extra] if extra else []) + owners)))
    return tuple(found)
