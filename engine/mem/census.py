"""The exact ownership census of one KV pool: who references each page, by page id.

Keeps nothing itself: it is the independent witness of the ownership law (DESIGN.md).
Counters can balance while a page is owned twice and another is leaked; this cannot,
because it counts the page ids every owner actually references.

Cost: one concatenation of every owner's pages and a few byte masks over the pool; the
per-page histograms and the owner names are computed only on a failing state.
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
) -> Census:
    """Census of pages ``1..num_pages``.

    owned:      the pages each owner holds (tree nodes, request rows, session slots).
    referenced: pages live rows read (their whole ``[0, allocated)`` range); reading a free
                page is dangling even when the page is owned by the tree.
    """
    owned = [(label, pages) for label, pages in owned if len(pages)]
    referenced = [(label, pages) for label, pages in referenced if len(pages)]
    own, own_owner = _flatten(owned)
    ref, _ = _flatten(referenced)
    ids = [a for a in (own, ref, free_pages) if len(a)]
    top = max([num_pages, *(int(a.max()) for a in ids)])
    size = top + 1
    free = np.zeros(size, dtype=bool)
    free[free_pages] = True
    repeats = np.count_nonzero(free) != len(free_pages)
    if top > num_pages or any(int(a.min()) < 1 for a in ids) or repeats:
        return _census_by_histogram(num_pages, size, free_pages, owned, referenced, own, own_owner, ref)
    held = np.zeros(size, dtype=bool)
    held[own] = True
    live = held.copy()
    live[ref] = True
    free[0] = True  # page 0 is reserved: never an orphan
    duplicates = _EMPTY
    if len(own) > np.count_nonzero(held):  # some page is listed twice: by one owner or by two
        duplicates = _true_duplicates(np.flatnonzero(np.bincount(own, minlength=size) >= 2), own, own_owner)
    return Census(
        num_pages=num_pages,
        duplicates=_witnesses(duplicates, owned),
        dangling=_witnesses(np.flatnonzero(live & free), [*owned, *referenced], "free"),
        orphans=tuple(np.flatnonzero(~(free | held))[:MAX_WITNESSES].tolist()),
    )


def _census_by_histogram(
    num_pages: int, size: int, free_pages: np.ndarray, owned: Sequence[PageRefs],
    referenced: Sequence[PageRefs], own: np.ndarray, own_owner: np.ndarray, ref: np.ndarray,
) -> Census:
    """The general path, for free lists with repeats or ids out of range (a broken state)."""
    free_count = np.bincount(free_pages, minlength=size)
    own_count = np.bincount(own, minlength=size)
    live = own_count > 0
    live[ref] = True
    orphans = np.flatnonzero((free_count == 0) & (own_count == 0))
    return Census(
        num_pages=num_pages,
        duplicates=_witnesses(_true_duplicates(np.flatnonzero(own_count >= 2), own, own_owner), owned),
        dangling=_witnesses(np.flatnonzero(live & (free_count > 0)), [*owned, *referenced], "free"),
        orphans=tuple(orphans[(orphans >= 1) & (orphans <= num_pages)][:MAX_WITNESSES].tolist()),
        free_repeats=tuple(np.flatnonzero(free_count >= 2)[:MAX_WITNESSES].tolist()),
    )


def _flatten(refs: Sequence[PageRefs]) -> tuple[np.ndarray, np.ndarray]:
    """Every owner's pages concatenated with the owner's index; a page repeated next to
    itself within one owner (the slots of one page) is kept once."""
    if not refs:
        return _EMPTY, _EMPTY
    pages = np.concatenate([p for _, p in refs]).astype(np.int64, copy=False)
    owner = np.repeat(np.arange(len(refs)), [len(p) for _, p in refs])
    keep = np.ones(len(pages), dtype=bool)
    keep[1:] = (pages[1:] != pages[:-1]) | (owner[1:] != owner[:-1])
    return pages[keep], owner[keep]


def _true_duplicates(candidates: np.ndarray, own: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Pages held by two or more distinct owners (a candidate may be one owner's repeat)."""
    if not len(candidates):
        return candidates
    chosen = np.isin(own, candidates)
    pairs = np.unique(np.stack([own[chosen], owner[chosen]]), axis=1)
    pages, counts = np.unique(pairs[0], return_counts=True)
    return pages[counts >= 2]


def _witnesses(pages: np.ndarray, refs: Sequence[PageRefs], extra: str | None = None) -> tuple[PageOwners, ...]:
    """Name the owners of the first few offending pages (only computed when there are any)."""
    found = []
    for page in pages[:MAX_WITNESSES].tolist():
        owners = sorted({label for label, held in refs if bool(np.any(held == page))})
        found.append(PageOwners(page, tuple(([extra] if extra else []) + owners)))
    return tuple(found)
