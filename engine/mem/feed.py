"""Change feeds: what a component changed, published as it happens, for the readers that follow
the component without reading it whole (the incremental census, engine/observe/).

Keeps: a log receives, in order, every change published after it subscribed and since its
last ``take``; when its publisher was reset, or it grew past its bound, it drops what it
holds and says so (``lost``): its reader then reads the component whole. A log lives as long
as its reader keeps it (the feed holds it weakly); publishing to no log costs one empty loop.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class ChangeLog(Generic[T]):
    """The changes one reader has not taken yet (``lost``: some were dropped)."""

    __slots__ = ("__weakref__", "changes", "limit", "lost")

    def __init__(self, limit: int) -> None:
        self.changes: list[T] = []
        self.limit = limit
        self.lost = True  # nothing was seen before the subscription: read the component whole

    def take(self) -> tuple[list[T], bool]:
        """The changes since the last call and whether any were lost; then empty."""
        changes, lost = self.changes, self.lost
        self.changes, self.lost = [], False
        return changes, lost

    def _append(self, change: T) -> None:
        if self.lost:
            return  # the reader re-reads the component anyway
        if len(self.changes) >= self.limit:
            self.changes, self.lost = [], True
            return
        self.changes.append(change)

    def _drop(self) -> None:
        self.changes, self.lost = [], True


class ChangeFeed(Generic[T]):
    """The publisher's side: every live log receives each published change."""

    __slots__ = ("_logs",)

    def __init__(self) -> None:
        self._logs: list[weakref.ref[ChangeLog[T]]] = []

    def subscribe(self, limit: int = 1 << 16) -> ChangeLog[T]:
        """A log of this feed's changes from now on (it starts ``lost``: read the whole)."""
        self._logs = [ref for ref in self._logs if ref() is not None]
        log: ChangeLog[T] = ChangeLog(limit)
        self._logs.append(weakref.ref(log))
        return log

    @property
    def followed(self) -> bool:
        """Whether a log may still read this feed (a publisher may skip building a change)."""
        return bool(self._logs)

    def publish(self, change: T) -> None:
        for ref in self._logs:
            log = ref()
            if log is not None:
                log._append(change)

    def reset(self) -> None:
        """The component was rebuilt wholesale: every log is lost."""
        for ref in self._logs:
            log = ref()
            if log is not None:
                log._drop()


class ChangedTuple(tuple[T, ...]):
    """A tuple one reader hands out again and again, naming what changed since the one it
    handed out before: ``prior`` (that tuple), ``fresh`` (its items not in ``prior``: rebuilt
    or added) and ``gone`` (``prior``'s items not in it) — it is ``prior`` - ``gone`` +
    ``fresh``, every kept item the very object ``prior`` held (what lets a checker re-test only
    the fresh items and update sums: invariants/checking/memos.py)."""

    prior: tuple[T, ...] | None
    fresh: tuple[T, ...]
    gone: tuple[T, ...]

    @classmethod
    def of(
        cls,
        items: Iterable[T],
        prior: tuple[T, ...] | None,
        fresh: tuple[T, ...],
        gone: tuple[T, ...],
    ) -> ChangedTuple[T]:
        out = cls(items)
        out.prior, out.fresh, out.gone = prior, fresh, gone
        if isinstance(prior, ChangedTuple):
            # only the newest tuple's prior is read: a chain would keep every tuple handed
            # out, and every record it held, alive (and walked by each collection) for good
            prior.prior = None
        return out
