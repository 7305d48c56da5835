"""A launched batch is an owner of its reads until processed (engine/observe/inflight.py).

One request decodes position 9 at page size 1 with a 4-token window: the launched batch reads
full slots for positions 0..9 and SWA slots for 5..9. Exact slot ids are pinned.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.config import MemoryConfig
from engine.mem.allocator import SWAAllocator
from engine.memory import KVMemory
from engine.model.runner import ForwardBatch, ForwardMode
from engine.observe.inflight import InFlightReads
from engine.request import FinishReason, Req

WINDOW = 4


@pytest.fixture
def launched() -> tuple[KVMemory, Req, ForwardBatch, InFlightReads]:
    """A decode of ``r0`` launched (forward #1) and followed; its row holds slots 1..10."""
    mem = KVMemory.from_config(
        MemoryConfig(max_total_tokens=64, swa_tokens=64, sliding_window=WINDOW, max_num_reqs=2)
    )
    alloc = mem.allocator
    assert isinstance(alloc, SWAAllocator)
    req = Req("r0", list(range(9)), [0])
    row = mem.req_to_token_pool.alloc()
    assert row is not None
    req.req_pool_idx = row
    slots = alloc.alloc(10)
    assert slots is not None and slots.tolist() == list(range(1, 11))
    mem.req_to_token_pool.write(row, 0, slots)
    fb = ForwardBatch(
        ForwardMode.DECODE,
        [req],
        np.array([0]),
        np.array([9]),
        slots[9:],
        np.array([row]),
        np.array([9]),
        np.array([1]),
        np.array([10]),
        mem.req_to_token_pool.req_to_token,
    )
    reads = InFlightReads(mem)
    assert reads.update([], fb, 1, "forward of iteration 1") == ()
    return mem, req, fb, reads


def test_an_swa_slot_freed_inside_the_launched_window_is_named(launched) -> None:
    """Position 5 is the first key the launched decode reads; freeing its SWA slot before the
    batch is processed (a slide on the next batch's length) names slot, position, batch and
    request, and says the request's own cursor passed it."""
    mem, req, fb, reads = launched
    mem.allocator.free_swa(np.array([6]))  # position 5 lives in full slot 6
    req.swa_evicted_seqlen = 6
    (finding,) = reads.update([fb], None, 2, "schedule of iteration 2")
    assert finding.startswith("launched batch #1 (decode) reads swa slot 6 (position 5) for r0")
    assert "freed by its own window slide (swa_evicted_seqlen=6)" in finding
    assert "seen at schedule of iteration 2" in finding


def test_a_slot_left_of_the_window_may_go(launched) -> None:
    """Position 4 is outside the model's window for the launched decode (9 - 4 = 5): its SWA
    slot may be freed under the batch (SGLang's slack is the engine's business, not this)."""
    mem, _, fb, reads = launched
    mem.allocator.free_swa(np.array([5]))
    assert reads.update([fb], None, 2, "schedule of iteration 2") == ()


def test_a_full_page_freed_under_a_kept_read_is_named(launched) -> None:
    """Any full slot of ``[0, seq_len)`` is read: freeing slot 1 (position 0) is named."""
    mem, _, fb, reads = launched
    mem.allocator.free(np.array([1]))
    (finding,) = reads.update([fb], None, 2, "schedule of iteration 2")
    assert "reads full slot 1 (position 0) for r0" in finding
    assert "freed by another owner" in finding


def test_a_row_repointed_at_a_live_copy_keeps_its_reads(launched) -> None:
    """An insert that finds the same tokens in the tree frees the request's duplicates and
    re-points its row at the tree's copy: the read goes through the row, and it is live."""
    mem, _, fb, reads = launched
    copy = mem.allocator.alloc(3)
    assert copy is not None and copy.tolist() == [11, 12, 13]
    mem.req_to_token_pool.write(fb.req_pool_indices[0], 5, copy)
    mem.allocator.free(np.array([6, 7, 8]))
    assert reads.update([fb], None, 2, "schedule of iteration 2") == ()


def test_a_finished_request_and_a_processed_batch_hold_nothing(launched) -> None:
    """A finished request's result is dropped at processing (SGLang frees its tail while the
    next batch runs); a processed batch is no longer followed."""
    mem, req, fb, reads = launched
    mem.allocator.free_swa(np.array([6]))
    req.finished_reason = FinishReason.of_length(1)
    assert reads.update([fb], None, 2, "schedule of iteration 2") == ()
    req.finished_reason = None
    assert reads.update([], None, 2, "process of iteration 2") == ()


def test_a_row_given_back_and_handed_to_a_launched_request_is_watched(launched) -> None:
    """r0 finishes and gives its row back; r1 takes the row and is launched before the next
    view: the row's freeing is r0's, not r1's — a slot of r1's read freed under its batch is
    named (the watch drops only the reads of batches launched before the row was freed)."""
    mem, req, fb, reads = launched
    row = int(fb.req_pool_indices[0])
    req.finished_reason = FinishReason.of_length(1)
    mem.allocator.free(np.arange(1, 11))
    mem.req_to_token_pool.free(row)
    r1 = Req("r1", list(range(4)), [0])
    assert mem.req_to_token_pool.alloc() != row  # the other row first: the pool hands FIFO
    r1.req_pool_idx = mem.req_to_token_pool.alloc()
    assert r1.req_pool_idx == row
    slots = mem.allocator.alloc(5)
    assert slots is not None
    mem.req_to_token_pool.write(row, 0, slots)
    fb1 = replace(fb, reqs=[r1], out_cache_loc=slots[4:], prefix_lens=np.array([4]),
                  seq_lens=np.array([5]))  # fmt: skip
    assert reads.update([], fb1, 2, "forward of iteration 2") == ()
    mem.allocator.free(slots[:1])
    found = reads.update([fb1], None, 3, "schedule of iteration 3")
    assert any(f"reads full slot {int(slots[0])} (position 0) for r1" in f for f in found)
