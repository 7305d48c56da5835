"""The shipped memory catalog: every invariant's fixtures isolate it, and real states pass."""

from __future__ import annotations

import dataclasses

import pytest

from engine.view import StateView
from invariants.checking.checker import Checker, run_fixture
from invariants.checking.loader import lint, load_catalog

CATALOG = load_catalog()
IDS = CATALOG.ids

REQUIRED = {
    "pool.busy_sum",
    "pool.idle_sum",
    "census.no_duplicates",
    "census.no_orphans",
    "census.no_dangling",
    "census.free_list_unique",
    "req_pool.conservation",
    "req_pool.free_rows_unique",
    "req_pool.no_row_free_and_used",
    "req_pool.row_zero_reserved",
    "tree.page_aligned",
    "req.cache_protected_page_aligned",
    "req.committed_le_allocated",
    "req.protected_le_committed",
    "tree.lock_ref_nonneg",
    "tree.protected_size_matches",
    "tree.evictable_size_matches",
    "tree.locked_ancestors",
    "tree.swa_lock_le_full",
    "tree.tombstone_unlocked",
    "tree.swa_sizes_match",
    "tree.idle_unlocked",
}


def test_catalog_has_the_memory_invariants() -> None:
    """Every memory-layer invariant of the brief is in the catalog, each with title and origin."""
    assert REQUIRED <= set(IDS)
    assert all(rule.title and rule.origin for rule in CATALOG)


def test_shipped_catalog_lints_clean() -> None:
    """`kvspec invariants lint` has nothing to say about the shipped catalog."""
    assert lint() == []


@pytest.mark.parametrize("rule_id", IDS)
def test_pass_fixture_passes_the_whole_catalog(rule_id: str) -> None:
    """An invariant's pass fixture violates no invariant of the catalog."""
    fixture = CATALOG.get(rule_id).fixtures["pass"]
    assert [str(v) for v in run_fixture(CATALOG, fixture)] == []


@pytest.mark.parametrize("rule_id", IDS)
def test_fail_fixture_fails_exactly_that_invariant(rule_id: str) -> None:
    """An invariant's fail fixture violates that invariant and no other."""
    fixture = CATALOG.get(rule_id).fixtures["fail"]
    found = run_fixture(CATALOG, fixture)
    assert {(v.invariant, v.kind) for v in found} == {(rule_id, "violation")}


@pytest.mark.parametrize("event", ["step", "idle"])
def test_consistent_busy_view_passes(event: str, busy_view: StateView) -> None:
    """A realistic consistent hybrid-SWA state (64 requests, 128 nodes) passes at step; at idle
    only the idle rules fire (requests still own KV, nodes still locked)."""
    found = Checker(CATALOG).check(event, dataclasses.replace(busy_view, event=event))
    expected = set() if event == "step" else {"pool.idle_sum", "tree.idle_unlocked"}
    assert {v.invariant for v in found} == expected


def test_census_message_names_pages_and_owners() -> None:
    """A census violation names the pool, the page ids and every owner."""
    (found,) = run_fixture(CATALOG, CATALOG.get("census.no_duplicates").fixtures["fail"])
    assert found.message == "full: owned twice: page 7 owned by tree:n3, req:r1@row2"


def test_busy_sum_message_shows_every_term() -> None:
    """The busy-sum message spells out the SGLang terms so a reader can see the drift."""
    (found,) = run_fixture(CATALOG, CATALOG.get("pool.busy_sum").fixtures["fail"])
    assert found.message == (
        "full: free=24 + evictable=8 + protected=8 + session_held=8"
        " + request_owned=8 = 56 != capacity=64"
    )


def test_swa_rules_ignore_plain_radix(busy_view: StateView) -> None:
    """SWA-only rules do not apply to a plain radix tree (its SWA counters are zero)."""
    tree = dataclasses.replace(busy_view.tree, kind="radix", swa_evictable_size=0)
    found = Checker(CATALOG).check("step", dataclasses.replace(busy_view, tree=tree))
    assert [v.invariant for v in found] == []
