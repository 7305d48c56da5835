"""Allocator scenarios with exact slot ids: token, paged and SWA hybrid allocators."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import KVAccountingError
from engine.mem.allocator import PagedAllocator, SWAAllocator, TokenAllocator

PAGE_SIZES = [1, 4, 16, 64]


def slots(*pages: int, ps: int) -> list[int]:
    return [p * ps + i for p in pages for i in range(ps)]


def make(ps: int, num_pages: int, strict: bool = True) -> PagedAllocator:
    return (
        TokenAllocator(num_pages, strict=strict)
        if ps == 1
        else PagedAllocator(num_pages * ps, ps, strict=strict)
    )


def test_token_allocator_hands_out_slots_from_one_never_zero() -> None:
    """Slot 0 is the padding target: a fresh token allocator hands out 1..size in order."""
    alloc = TokenAllocator(6)
    assert alloc.alloc(4).tolist() == [1, 2, 3, 4]
    assert alloc.alloc(2).tolist() == [5, 6]
    assert alloc.available_size() == 0
    assert alloc.alloc(1) is None


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_paged_alloc_takes_lowest_pages_and_never_page_zero(ps: int) -> None:
    """alloc(k pages) returns the slots of pages 1..k; capacity excludes page 0."""
    alloc = make(ps, 4)
    assert alloc.size == 4 * ps and alloc.available_size() == 4 * ps
    assert alloc.alloc(2 * ps).tolist() == slots(1, 2, ps=ps)
    assert alloc.alloc(ps).tolist() == slots(3, ps=ps)
    assert alloc.available_size() == ps


@pytest.mark.parametrize("ps", [4, 16, 64])
def test_paged_alloc_rejects_unaligned_sizes(ps: int) -> None:
    """alloc() takes whole pages only; a size that is not a page multiple is a caller bug."""
    with pytest.raises(KVAccountingError, match="not page aligned"):
        make(ps, 4).alloc(ps + 1)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_returns_none_and_takes_nothing_when_short(ps: int) -> None:
    """A request larger than the free pages gets None and the free list is unchanged."""
    alloc = make(ps, 3)
    alloc.alloc(ps)
    assert alloc.alloc(3 * ps) is None
    assert alloc.alloc_extend([0], [3 * ps], [-1]) is None
    assert alloc.available_size() == 2 * ps
    assert alloc.alloc(2 * ps).tolist() == slots(2, 3, ps=ps)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_extend_fills_the_partial_last_page_first(ps: int) -> None:
    """Extend [prefix, seq): the prefix's last page is continued at last_loc+1, then fresh pages."""
    alloc = make(ps, 8)
    first = alloc.alloc_extend([0], [ps + 1], [-1])  # pages 1, 2 (page 2 holds one token)
    assert first.tolist() == slots(1, ps=ps) + [2 * ps]
    out = alloc.alloc_extend([ps + 1], [3 * ps + 1], [int(first[-1])])
    in_page = list(range(2 * ps + 1, 3 * ps))  # rest of page 2
    assert out.tolist() == in_page + slots(3, ps=ps) + [4 * ps]
    assert len(out) == 2 * ps


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_extend_batches_take_fresh_pages_in_request_order(ps: int) -> None:
    """Two requests extended together get their fresh pages in request order."""
    alloc = make(ps, 8)
    out = alloc.alloc_extend([0, 0], [ps, 2 * ps], [-1, -1])
    assert out.tolist() == slots(1, ps=ps) + slots(2, 3, ps=ps)


@pytest.mark.parametrize("ps", [4, 16])
def test_alloc_extend_inside_one_page_takes_no_page(ps: int) -> None:
    """An extend that stays inside the prefix's last page takes only last_loc+1.. slots."""
    alloc = make(ps, 2)
    first = alloc.alloc_extend([0], [1], [-1])
    out = alloc.alloc_extend([1], [3], [int(first[-1])])
    assert out.tolist() == [ps + 1, ps + 2]
    assert alloc.available_size() == ps


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_alloc_decode_opens_a_page_only_on_its_first_slot(ps: int) -> None:
    """Decode of position seq_len-1 takes last_loc+1 unless (seq_len-1) % ps == 0."""
    alloc = make(ps, 4)
    row = alloc.alloc_extend([0], [ps], [-1]).tolist()
    out = alloc.alloc_decode([ps + 1], [row[-1]])  # position ps: opens page 2
    assert out.tolist() == [2 * ps]
    if ps > 1:
        assert alloc.alloc_decode([ps + 2], [2 * ps]).tolist() == [2 * ps + 1]
    assert alloc.available_size() == 2 * ps


def test_alloc_decode_batch_mixes_new_pages_and_continuations() -> None:
    """A decode batch: requests on a page boundary get fresh pages in order, others continue."""
    alloc = make(4, 8)
    a = alloc.alloc_extend([0], [4], [-1]).tolist()  # page 1 full
    b = alloc.alloc_extend([0], [2], [-1]).tolist()  # page 2, two slots
    out = alloc.alloc_decode([5, 3], [a[-1], b[-1]])
    assert out.tolist() == [12, 10]


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_free_of_one_slot_frees_its_whole_page(ps: int) -> None:
    """Paged free releases every page an index touches: one slot frees the whole page."""
    alloc = make(ps, 4)
    out = alloc.alloc(2 * ps)
    alloc.free(out[-1:])
    assert alloc.available_size() == 3 * ps
    assert alloc.is_free(np.array([1, 2])).tolist() == [False, True]


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_freed_pages_are_reused_after_never_used_ones_then_sorted(ps: int) -> None:
    """Free-list order: freed pages wait in release_pages until the never-used pages run
    out; then released and free pages are merged and handed out lowest first."""
    alloc = make(ps, 5)
    alloc.alloc(3 * ps)  # pages 1, 2, 3
    alloc.free(np.array(slots(3, ps=ps)))
    alloc.free(np.array(slots(1, ps=ps)))
    assert alloc.alloc(ps).tolist() == slots(4, ps=ps)  # never-used page first
    assert alloc.alloc(2 * ps).tolist() == slots(1, 3, ps=ps)  # 5 alone is short: merge, sort
    assert alloc.alloc(ps).tolist() == slots(5, ps=ps)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_strict_double_free_names_the_page(ps: int) -> None:
    """Strict mode: freeing a free page raises and names it."""
    alloc = make(ps, 4)
    out = alloc.alloc(2 * ps)
    alloc.free(out[:ps])
    with pytest.raises(KVAccountingError, match=r"double free of page\(s\) \[1\]"):
        alloc.free(out[:1])


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_strict_out_of_range_free_names_the_page(ps: int) -> None:
    """Strict mode: page 0 and pages past the pool are out of range."""
    alloc = make(ps, 4)
    with pytest.raises(KVAccountingError, match=r"out-of-range page\(s\) \[0\]"):
        alloc.free(np.array([0]))
    with pytest.raises(KVAccountingError, match=r"out-of-range page\(s\) \[5\]"):
        alloc.free(np.array([5 * ps]))


def test_strict_token_free_of_a_slot_twice_in_one_call_raises() -> None:
    """Page size 1: a slot listed twice in one free call is a double free."""
    alloc = TokenAllocator(4)
    out = alloc.alloc(2)
    with pytest.raises(KVAccountingError, match="double free"):
        alloc.free(np.array([out[0], out[0]]))


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_non_strict_mode_does_not_raise(ps: int) -> None:
    """Non-strict mode corrupts silently, as SGLang would: a double free is accepted."""
    alloc = make(ps, 4, strict=False)
    out = alloc.alloc(ps)
    alloc.free(out)
    alloc.free(out)
    assert alloc.available_size() == 5 * ps  # the page is counted twice


def test_free_of_nothing_is_a_no_op() -> None:
    """free([]) changes nothing (callers free empty ranges all the time)."""
    alloc = make(4, 2)
    alloc.free(np.empty(0, dtype=np.int64))
    assert alloc.available_size() == 8 and not alloc.release_pages


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_swa_alloc_sets_the_full_to_swa_mapping(ps: int) -> None:
    """SWA alloc takes a full and an SWA page together and maps each full slot to its SWA slot."""
    alloc = SWAAllocator(4 * ps, 2 * ps, ps)
    alloc.swa.alloc(ps)  # skew the SWA pool so the two pools differ
    out = alloc.alloc(ps)
    assert out.tolist() == slots(1, ps=ps)
    assert alloc.translate_to_swa(out).tolist() == slots(2, ps=ps)
    assert (
        alloc.available_size() == 0 == min(alloc.full_available_size(), alloc.swa_available_size())
    )
    assert alloc.full_available_size() == 3 * ps


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_swa_alloc_extend_and_decode_continue_the_swa_page(ps: int) -> None:
    """The partial-page continuation uses last_loc's SWA slot (the mapping of last_loc)."""
    alloc = SWAAllocator(4 * ps, 4 * ps, ps)
    alloc.swa.alloc(ps)
    first = alloc.alloc_extend([0], [1], [-1])
    assert alloc.translate_to_swa(first).tolist() == [2 * ps]
    nxt = alloc.alloc_decode([2], [int(first[-1])])
    expect = 2 * ps + 1 if ps > 1 else 3
    assert alloc.translate_to_swa(nxt).tolist() == [expect]


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_free_swa_frees_only_swa_and_zeroes_the_mapping(ps: int) -> None:
    """free_swa returns the SWA pages only; a later free returns the full pages and skips
    the already-freed SWA slots (their mapping is 0), so nothing is freed twice."""
    alloc = SWAAllocator(4 * ps, 4 * ps, ps)
    out = alloc.alloc(2 * ps)
    alloc.free_swa(out[:ps])
    assert alloc.translate_to_swa(out[:ps]).tolist() == [0] * ps
    assert (alloc.swa_available_size(), alloc.full_available_size()) == (3 * ps, 2 * ps)
    alloc.free(out)
    assert (alloc.swa_available_size(), alloc.full_available_size()) == (4 * ps, 4 * ps)


def test_swa_available_is_the_tighter_pool_and_alloc_respects_it() -> None:
    """available_size() = min(full, SWA); an alloc larger than the SWA pool gets None."""
    alloc = SWAAllocator(32, 8, 4)
    assert alloc.available_size() == 8
    assert alloc.alloc(12) is None
    assert alloc.full_available_size() == 32 and alloc.swa_available_size() == 8
    assert alloc.alloc_extend([0], [9], [-1]) is None
    assert alloc.alloc(8) is not None and alloc.available_size() == 0
