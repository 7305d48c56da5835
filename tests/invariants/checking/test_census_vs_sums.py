"""The census beats the sums: SGLang's counter equation can balance while one page is
owned twice and another is leaked; the exact census names both page ids."""

from __future__ import annotations

import numpy as np

from engine.config import MemoryConfig
from engine.memory import KVMemory
from engine.observe.memory_view import memory_view
from engine.request import Req
from invariants.checking.checker import Checker, Level
from invariants.checking.loader import load_catalog


def two_running_requests(page_size: int) -> tuple[KVMemory, Req, Req]:
    mem = KVMemory.from_config(MemoryConfig(page_size=page_size, max_total_tokens=64 * page_size))
    a, b = Req("a", list(range(1, 9))), Req("b", list(range(101, 109)))
    for req in (a, b):
        req.fill_ids = list(req.origin_input_ids)
        mem.match_prefix(req)
        mem.lock(req)
    mem.alloc_for_extend([a, b])
    return mem, a, b


def violated(mem: KVMemory, reqs: list[Req]) -> dict[str, str]:
    checker = Checker(load_catalog(), level=Level.RECORD)
    checker.check("step", memory_view(mem, "step", 1, reqs))
    return {v.invariant: v.message for v in checker.violations}


def test_clean_state_passes_sums_and_census() -> None:
    """Two freshly extended requests: every invariant holds."""
    mem, a, b = two_running_requests(page_size=1)
    assert violated(mem, [a, b]) == {}


def test_page_owned_twice_and_page_leaked_balance_the_sum_but_not_the_census() -> None:
    """Row b's last slot is overwritten with row a's last slot (owned twice) and b's own
    slot is left allocated with no owner (leaked): the sum is unchanged, the census names
    both slots, and the owners of the doubly owned one."""
    mem, a, b = two_running_requests(page_size=1)
    table = mem.req_to_token_pool.req_to_token
    shared = int(table[a.req_pool_idx, 7])
    leaked = int(table[b.req_pool_idx, 7])
    mem.req_to_token_pool.write(b.req_pool_idx, 7, np.array([shared]))
    found = violated(mem, [a, b])
    assert "pool.busy_sum" not in found
    assert set(found) == {"census.no_duplicates", "census.no_orphans"}
    assert f"page {shared} owned by req:a@row1, req:b@row2" in found["census.no_duplicates"]
    assert str(leaked) in found["census.no_orphans"]


def test_paged_double_ownership_is_reported_by_page_id() -> None:
    """With page size 4 the census works in pages: b's second page replaced by a's."""
    mem, a, b = two_running_requests(page_size=4)
    table = mem.req_to_token_pool.req_to_token
    mem.req_to_token_pool.write(b.req_pool_idx, 4, table[a.req_pool_idx, 4:8])
    shared_page = int(table[a.req_pool_idx, 4]) // 4
    found = violated(mem, [a, b])
    assert "pool.busy_sum" not in found
    assert f"page {shared_page} owned by" in found["census.no_duplicates"]
    assert "census.no_orphans" in found
