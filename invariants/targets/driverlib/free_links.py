"""vLLM's free block queue as its links: each block's ``next_free_block`` read as an id, so that
the driver sends the links vLLM wrote since the last view, not the queue, and kvspec's side
walks them (invariants/targets/vllm/free_queue.py). Shared by the vllm driver and kvspec; runs
inside the engine's venv; imports nothing of kvspec.

Keeps: a link is a block id, or one of the three ids no block has — the queue's end (the fake
tail: its own id), its fake head, none. ``walk`` lists what the driver's walk of the objects
lists (driver/pool_reads.py ``free_walk``) from the same links: it stops at the end, at none,
or one past the pool's size (a cycle: a double free); a link back to the fake head lists the
head's id (-1) and goes on from the head's first block, as following the objects does.
"""

from __future__ import annotations

TAIL, HEAD, UNLINKED = -1, -2, -3  # the fake tail's id, the fake head, no block (None)


def walk(first: int, nexts: list[int], num_blocks: int) -> list[int]:
    """The queue in order from ``first`` (the fake head's link), ``nexts`` by block id."""
    out: list[int] = []
    append, node = out.append, first
    for _ in range(num_blocks + 1):
        if node == HEAD:
            append(-1)  # (the fake head's own id, as the objects' walk lists it)
            node = first
        elif node < 0:
            break
        else:
            append(node)
            node = nexts[node]
    return out
