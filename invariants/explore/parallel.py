"""A spawn pool for work mapped in order (the gate's units, `kvspec sglang seed-bugs`' seeds).
The explorers run on a fleet instead (invariants/fleet/: workers that survive, a journal);
the report's cells use their own pool (invariants/report/backends.py).

Keeps: every pool starts its workers with ``spawn`` — a fresh interpreter that imports what
it needs — never ``fork``, which copies a parent holding threads (a server, torch's pools)
mid-lock. Work functions must therefore be module-level (picklable by name), and worker
processes see no monkeypatch made in the parent.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def spawn_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool of ``workers`` spawned workers."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def map_in_order(
    fn: Callable[[Item], Result], items: Iterable[Item], workers: int
) -> Iterator[Result]:
    """``fn`` over ``items`` on ``workers`` spawned processes, yielded in item order (in this
    process when ``workers <= 1``); closing the iterator early cancels the items not started."""
    if workers <= 1:
        yield from map(fn, items)
        return
    with spawn_pool(workers) as pool:
        try:
            yield from pool.map(fn, items)
        finally:  # an early stop (fail-fast) drops the items not yet started
            pool.shutdown(cancel_futures=True)
