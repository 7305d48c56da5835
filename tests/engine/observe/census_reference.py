"""Reference census (the first, per-owner implementation): the oracle the vectorised
engine/observe/census.py is tested against. Simple on purpose; slow on big pools."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import groupby

import numpy as np

from engine.observe.census import MAX_WITNESSES, PageRefs
from engine.view import Census, PageOwners


def reference_census(
    num_pages: int,
    free_pages: np.ndarray,
    owned: Sequence[PageRefs],
    referenced: Sequence[PageRefs] = (),
    *,
    slots_per_page: int,
) -> Census:
    """Census of pages ``1..num_pages``.

    owned:      the pages each owner holds (tree nodes, request rows, session slots).
    referenced: pages live rows read (their whole ``[0, allocated)`` range); reading a free
                page is dangling even when the page is owned by the tree.
    A run of equal ids in one owner holds its page once per ``slots_per_page`` ids (rounded
    up); a page held twice in all — by two owners or by one — is a duplicate.
    """
    holdings = {label: Counter() for label, pages in owned if len(pages)}
    for label, pages in owned:
        for page, run in groupby(pages.tolist()):
            holdings[label][page] += -(-len(list(run)) // slots_per_page)
    owned = [(label, np.unique(pages)) for label, pages in owned if len(pages)]
    referenced = [(label, np.unique(pages)) for label, pages in referenced if len(pages)]
    size = _bincount_size(num_pages, free_pages, owned, referenced)
    free_count = np.bincount(free_pages, minlength=size)
    own_count = _count(owned, size)
    live = (own_count + _count(referenced, size)) > 0
    orphans = np.flatnonzero((free_count == 0) & (own_count == 0))
    return Census(
        num_pages=num_pages,
        duplicates=_duplicates(holdings),
        dangling=_witnesses(np.flatnonzero(live & (free_count > 0)), [*owned, *referenced], "free"),
        orphans=tuple(orphans[(orphans >= 1) & (orphans <= num_pages)][:MAX_WITNESSES].tolist()),
        free_repeats=tuple(np.flatnonzero(free_count >= 2)[:MAX_WITNESSES].tolist()),
    )


def _duplicates(holdings: dict[str, Counter]) -> tuple[PageOwners, ...]:
    """Pages held twice in all, each with its owners (``label (twice)`` for an owner that
    holds it twice, ``label (3 times)`` ...)."""
    total = sum(holdings.values(), Counter())
    found = []
    for page in sorted(p for p, times in total.items() if times >= 2)[:MAX_WITNESSES]:
        names = [_name(label, held[page]) for label, held in sorted(holdings.items()) if held[page]]
        found.append(PageOwners(page, tuple(names)))
    return tuple(found)


def _name(label: str, times: int) -> str:
    return label if times == 1 else f"{label} (twice)" if times == 2 else f"{label} ({times} times)"


def _bincount_size(num_pages: int, free_pages: np.ndarray, *groups: Sequence[PageRefs]) -> int:
    # out-of-range ids must not crash the census: they widen the histogram instead
    top = max([num_pages, *(int(p.max()) for g in groups for _, p in g)], default=num_pages)
    if len(free_pages):
        top = max(top, int(free_pages.max()))
    return top + 1


def _count(refs: Sequence[PageRefs], size: int) -> np.ndarray:
    if not refs:
        return np.zeros(size, dtype=np.int64)
    return np.bincount(np.concatenate([pages for _, pages in refs]), minlength=size)


def _witnesses(
    pages: np.ndarray, refs: Sequence[PageRefs], extra: str | None = None
) -> tuple[PageOwners, ...]:
    """Name the owners of the first few offending pages (only computed when there are any)."""
    found = []
    for page in pages[:MAX_WITNESSES].tolist():
        owners = [label for label, held in refs if _holds(held, page)]
        found.append(PageOwners(page, tuple(([extra] if extra else []) + sorted(set(owners)))))
    return tuple(found)


def _holds(sorted_pages: np.ndarray, page: int) -> bool:
    i = np.searchsorted(sorted_pages, page)
    return bool(i < len(sorted_pages) and sorted_pages[i] == page)
