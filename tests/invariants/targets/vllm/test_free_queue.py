"""kvspec's side walks vLLM's free block queue from the links vLLM wrote since the last view
(invariants/targets/vllm/free_queue.py): whatever vLLM did to the queue between two views —
blocks taken off its front or out of its middle, put at its front or its end, a block put back
twice (a double free: a cycle), a link cut — the walk is what following the links lists, as
the driver's walk of the objects does, and the blocks named as gone and come are exactly those
whose membership changed. The queue here is a model of vLLM 0.33.0's
``FreeKVCacheBlockQueue`` (kv_cache_utils.py): the same link writes, each recorded as the
driver's block hook records them. Plain Python: runs without vLLM."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from invariants.targets.driverlib.free_links import HEAD, TAIL, UNLINKED, walk
from invariants.targets.vllm.free_queue import FreeQueue

N = 10  # blocks
WRITTEN: set[int] = set()  # the blocks whose next link was written since the last view


class Block:
    def __init__(self, block_id: int) -> None:
        object.__setattr__(self, "block_id", block_id)
        self.prev = self.next = None

    def __setattr__(self, name: str, value) -> None:  # (the driver's hook, for ``next``)
        object.__setattr__(self, name, value)
        if name == "next":
            WRITTEN.add(self.block_id)


class Queue:
    """vLLM's queue operations, link for link (its fake head and tail: ``head``, ``tail``)."""

    def __init__(self, blocks: list[Block]) -> None:
        self.head, self.tail = Block(-1), Block(-1)
        chain = [self.head, *blocks, self.tail]
        for before, after in pairwise(chain):
            before.next, after.prev = after, before

    def popleft_n(self, n: int) -> None:
        node = self.head.next
        for _ in range(n):
            if node is self.tail or node is None:
                break
            last, node = node, node.next
            last.prev = last.next = None
        self.head.next = node
        if node is not None:
            node.prev = self.head

    def remove(self, block: Block) -> None:
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None

    def append(self, block: Block) -> None:  # (on a block in the queue: a double free)
        last = self.tail.prev
        last.next, block.prev = block, last
        block.next, self.tail.prev = self.tail, block

    def prepend(self, block: Block) -> None:
        first = self.head.next
        block.prev, block.next = self.head, first
        self.head.next = first.prev = block

    def walk(self) -> list[int]:
        """The driver's walk of the objects (pool_reads.free_walk)."""
        out, node = [], self.head.next
        for _ in range(N + 1):
            if node is None or node is self.tail:
                break
            out.append(node.block_id)
            node = node.next
        return out

    def link(self, node) -> int:
        if node is None or node is self.tail:
            return UNLINKED if node is None else TAIL
        return HEAD if node is self.head else node.block_id


def apply(queue: Queue, blocks: list[Block], kind: str, i: int) -> None:
    """One operation, as vLLM's block pool does them (or a fault: ``double``, ``cut``)."""
    block, listed = blocks[i], set(queue.walk())
    if kind == "pop":
        queue.popleft_n(i % 3 + 1)
    elif kind == "remove" and i in listed and None not in (block.prev, block.next):
        queue.remove(block)
    elif kind in ("append", "prepend") and block.next is None and block.prev is None:
        if kind == "append" or queue.head.next is not None:
            getattr(queue, kind)(block)
    elif kind == "double" and i in listed:
        queue.append(block)
    elif kind == "cut":
        block.next = None


OPS = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from(["pop", "remove", "append", "prepend", "double", "cut"]),
            st.integers(0, N - 1),
        ),
        max_size=6,
    ),
    max_size=8,
)


@given(OPS)
def test_the_walk_from_the_written_links_is_the_queues(views) -> None:
    """After every view the rebuilt walk equals the walk of the objects and the links' walk;
    where it was built from the last walk, the blocks named gone and come are the changes."""
    blocks = [Block(i) for i in range(N)]
    queue, rebuilt = Queue(blocks), FreeQueue()
    before: list[int] = []
    for number, ops in enumerate([[], *views]):
        WRITTEN.clear()
        for kind, i in ops:
            apply(queue, blocks, kind, i)
        ids = list(range(N)) if number == 0 else sorted(WRITTEN - {-1})
        links = [queue.link(queue.head.next), ids, [queue.link(blocks[i].next) for i in ids]]
        changed = rebuilt.relink(links, N, whole=number == 0)
        now = queue.walk()
        assert rebuilt.walk.tolist() == now
        assert walk(links[0], [queue.link(b.next) for b in blocks], N) == now
        if changed is not None:
            gone, came = changed
            assert set(before) - set(gone) | set(came) == set(now)
            assert not set(gone) - set(before)
        before = now


def test_a_front_a_middle_and_an_end_move_only_the_blocks_that_moved() -> None:
    """Blocks 0 and 1 taken off the front, 5 out of the middle, 7 put at the front, 8 at the
    end: the walk is [7, 2, 3, 4, 6, 8] built from the last one (no walk link by link)."""
    rebuilt = FreeQueue()
    rebuilt.relink([0, list(range(7)), [1, 2, 3, 4, 5, 6, TAIL]], 9, whole=True)
    assert rebuilt.walk.tolist() == [0, 1, 2, 3, 4, 5, 6]
    links = [7, [0, 1, 4, 5, 6, 7, 8], [UNLINKED, UNLINKED, 6, UNLINKED, 8, 2, TAIL]]
    assert rebuilt.relink(links, 9, whole=False) == ([0, 1, 5], [7, 8])
    assert rebuilt.walk.tolist() == [7, 2, 3, 4, 6, 8]
