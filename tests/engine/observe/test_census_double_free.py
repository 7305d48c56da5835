"""A page freed twice and then handed twice to one new request (what real SGLang did under
a double-free fault): no two owners share the page, none is free or leaked — the only trace
in the census is one owner holding the page twice, which census.no_duplicates must name
('... (twice)'), not leave to the pool sums alone."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.request import SamplingParams
from invariants.checking.checker import Checker
from invariants.checking.loader import load_catalog

CATALOG = load_catalog()


def _engine(page_size: int) -> Engine:
    memory = MemoryConfig(
        page_size=page_size,
        max_total_tokens=256,
        max_num_reqs=8,
        context_len=128,
        cache="radix",
        strict=False,
    )
    return Engine(EngineConfig(memory=memory, enable_overlap=False))


def _double_free_lowest_page(engine: Engine) -> int:
    """Free the lowest free page a second time; the allocator's merge then lists it twice
    at the front of its free list, where the next allocation takes both copies."""
    alloc, ps = engine.mem.allocator, engine.mem.page_size
    alloc.merge_and_sort_free()
    page = int(alloc.free_pages[0])
    alloc.free(np.arange(page * ps, (page + 1) * ps))
    alloc.merge_and_sort_free()
    return page


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_double_freed_page_handed_twice_to_one_request_is_a_duplicate(page_size: int) -> None:
    """After the double-freed page went twice to one new request (its prompt now held by a
    tree node), no page is free, leaked or shared by two owners — census.no_duplicates
    fires beside the busy sum, naming the page and that one owner, as holding it twice."""
    engine = _engine(page_size)
    engine.submit([5] * 10, SamplingParams(max_new_tokens=3, ignore_eos=True))
    while not engine.is_idle():
        engine.step()
    page = _double_free_lowest_page(engine)
    engine.submit(list(range(40, 60)), SamplingParams(max_new_tokens=3, ignore_eos=True))
    engine.step()
    violations = Checker(CATALOG).check("step", engine.state_view("step"))
    fired = {v.invariant for v in violations}
    assert {"census.no_duplicates", "pool.busy_sum"} <= fired, violations
    census = engine.state_view("step").pools[0].census
    assert [(d.page, len(d.owners)) for d in census.duplicates] == [(page, 1)]
    assert census.duplicates[0].owners[0].endswith(" (twice)")
    assert not (census.orphans or census.dangling or census.free_repeats)
