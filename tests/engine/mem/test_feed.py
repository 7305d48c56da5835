"""Change feeds (engine/mem/feed.py) and what the allocator, the node registry and the
request table publish: a log receives every change after it subscribed, in order, until
taken; it starts lost (its reader reads the component whole first), and a reset or an
overflow loses it again; the allocator publishes exactly the page ids it takes and returns,
and nothing on a merge."""

from __future__ import annotations

import gc

import numpy as np

from engine.cache.radix_cache import RadixCache
from engine.mem.allocator import RELEASED, TAKEN, PagedAllocator
from engine.mem.feed import ChangeFeed
from engine.mem.req_to_token import ReqToTokenPool


def test_a_log_starts_lost_then_receives_every_change_in_order() -> None:
    """Nothing before the first take is kept (the reader recounts then); afterwards each
    published change arrives once, in publication order."""
    feed: ChangeFeed[int] = ChangeFeed()
    log = feed.subscribe()
    feed.publish(1)
    assert log.take() == ([], True)
    for change in (2, 3, 4):
        feed.publish(change)
    assert log.take() == ([2, 3, 4], False)
    assert log.take() == ([], False)


def test_reset_and_overflow_lose_the_log() -> None:
    """A reset of the publisher, or more changes than the log's bound, drop what it holds
    and mark it lost; it records again after the next take."""
    feed: ChangeFeed[int] = ChangeFeed()
    log = feed.subscribe(limit=2)
    log.take()
    feed.publish(1)
    feed.reset()
    assert log.take() == ([], True)
    for change in (1, 2, 3):
        feed.publish(change)
    assert log.take() == ([], True)
    feed.publish(4)
    assert log.take() == ([4], False)


def test_a_dropped_log_is_forgotten() -> None:
    """The feed holds its logs weakly: a reader that is gone costs nothing more."""
    feed: ChangeFeed[int] = ChangeFeed()
    log = feed.subscribe()
    del log
    gc.collect()
    kept = feed.subscribe()
    assert len(feed._logs) == 1 and feed._logs[0]() is kept


def _pages(changes: list[tuple[np.ndarray, int]]) -> list[tuple[list[int], int]]:
    return [(pages.tolist(), sign) for pages, sign in changes]


def test_the_allocator_publishes_pages_taken_and_returned() -> None:
    """Page size 4, 8 pages: two allocations take pages 1-2 and 3; frees return 2 and 1
    (one call each); a merge (forced by taking 6 pages) publishes only the pages taken."""
    alloc = PagedAllocator(32, 4)
    log = alloc.changes.subscribe()
    log.take()
    first, second = alloc.alloc(8), alloc.alloc(4)
    assert first is not None and second is not None
    alloc.free(first[4:])
    alloc.free(first[:4])
    assert _pages(log.take()[0]) == [
        ([1, 2], TAKEN),
        ([3], TAKEN),
        ([2], RELEASED),
        ([1], RELEASED),
    ]
    assert alloc.alloc(24) is not None  # 5 never-used pages + the 2 released: merged first
    assert _pages(log.take()[0]) == [([1, 2, 4, 5, 6, 7], TAKEN)]
    alloc.clear()
    assert log.take() == ([], True)


def test_the_node_registry_publishes_owner_changes_only() -> None:
    """An insert publishes its new node; re-locking the path (links and locks only) publishes
    nothing; evicting the node publishes its id once more."""
    alloc = PagedAllocator(16, 1)
    cache = RadixCache(ReqToTokenPool(4, 32), alloc, 1)
    log = cache.node_registry().changes.subscribe()
    log.take()
    slots = alloc.alloc(3)
    assert slots is not None
    cache.insert([7, 8, 9], slots)
    cache.node_registry().sync_owners()
    (ids,), _ = log.take()
    node = cache.node_registry().nodes[ids[0]]
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    cache.node_registry().sync_owners()
    assert log.take() == ([], False)
    assert cache.evict(3) == 3
    assert log.take() == ([[node.id]], False)


def test_the_request_table_publishes_the_rows_and_first_positions_written() -> None:
    """A row write publishes (row, start); a point write its rows and positions (copies:
    the caller's arrays stay the caller's); a table nobody follows builds no copies."""
    pool = ReqToTokenPool(4, 16)
    assert not pool.changes.followed
    log = pool.changes.subscribe()
    log.take()
    pool.write(2, 3, np.array([7, 8], dtype=np.int64))
    rows, positions = np.array([1, 2]), np.array([5, 0])
    pool.write_points(rows, positions, np.array([9, 10]))
    rows[0] = 3
    (first, (point_rows, point_positions)), lost = log.take()
    assert first == (2, 3) and not lost
    assert point_rows.tolist() == [1, 2] and point_positions.tolist() == [5, 0]
