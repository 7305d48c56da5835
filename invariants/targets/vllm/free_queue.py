"""vLLM's free block queue rebuilt on kvspec's side from the links vLLM wrote (the driver reads
each written block's ``next_free_block``: driver/pool_reads.py, driverlib/free_links.py), so
that neither side walks a pool of ten thousand free blocks link by link at every view.

Keeps: ``walk`` is, at every view, what following the links from the fake head lists
(``free_links.walk``) — the links are vLLM's own, every write to one recorded by the block's
hook. The walk is built from the last one: vLLM takes blocks off the queue anywhere (``next``
None: unlinked), puts blocks at its front (``prepend_n``) and at its end (``append_n``), so the
new walk is guessed as the blocks put at the front, the last walk's still linked, the blocks
put at the end — and the guess is kept only if every link in it is the block's link now (the
joins are followed links; the kept run is compared at C speed): a guess that passes is the
walk. Anything else (a block taken and put back between views, a cycle) is walked link by link.
"""

from __future__ import annotations

import numpy as np

from invariants.targets.driverlib.free_links import TAIL, UNLINKED, walk

Links = tuple[list[int], list[int]]  # the blocks that left the queue, those that joined it


class FreeQueue:
    """One run's free queue: each block's link as last read, and the walk of them."""

    def __init__(self) -> None:
        self.next = _array([])  # each block's next (free_links' ids)
        self.walk = _array([])  # the queue in order (what the census reads)
        self.ends = True  # the walk ended at the queue's end (no block twice, no fake head)

    def relink(self, links: list, num_blocks: int, whole: bool) -> Links | None:
        """Take in ``links`` (``[first, ids, nexts]``: the fake head's next, and the blocks
        whose links vLLM wrote with their next now; ``whole``: every block's): the blocks
        that left the queue and those that joined it, or None where the walk was taken link
        by link (the set of free blocks must be taken again)."""
        first, ids, nexts = links
        if whole:  # (a run's first view is whole)
            self.next = np.full(num_blocks, UNLINKED, dtype=np.int64)
        self.next[ids] = nexts
        guessed = self._guess(first, num_blocks) if self.ends else None
        if guessed is not None:
            return guessed
        listed = walk(first, self.next.tolist(), num_blocks)
        self.walk = _array(listed)
        self.ends = len(listed) <= num_blocks  # (else a cycle: the walk ran out of blocks)
        return None

    def _guess(self, first: int, num_blocks: int) -> Links | None:
        """The walk as the blocks put at the front, the last walk's still linked and those
        put at the end, if every link agrees (None: not so)."""
        old, nexts = self.walk, self.next
        stays = nexts[old] != UNLINKED
        kept = old[stays]
        budget = num_blocks + 1 - len(kept)
        head = int(kept[0]) if len(kept) else None
        front = self._follow(first, head, budget)
        if front is None or not (nexts[kept[:-1]] == kept[1:]).all():
            return None
        after = nexts.item(kept[-1]) if len(kept) else TAIL  # (none kept: the front is all)
        end = self._follow(after, None, budget - len(front))
        if end is None:
            return None
        self.walk = np.concatenate([_array(front), kept, _array(end)])
        return old[~stays].tolist(), front + end

    def _follow(self, node: int, until: int | None, budget: int) -> list[int] | None:
        """The blocks from ``node`` up to ``until`` (None: the queue's end), at most
        ``budget``, or None if the links lead elsewhere (a fake head, none before ``until``,
        past ``budget``)."""
        out: list[int] = []
        append, item = out.append, self.next.item
        for _ in range(budget):
            if node == until or node < 0:
                break
            append(node)
            node = item(node)
        if node == until or (until is None and node in (TAIL, UNLINKED)):
            return out
        return None


def _array(blocks: list[int]) -> np.ndarray:
    return np.asarray(blocks, dtype=np.int64)
