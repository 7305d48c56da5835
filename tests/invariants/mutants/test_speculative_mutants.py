"""EAGLE's historical bugs, planted for one test from the bug zoo's registry
(invariants/mutants: one definition of each bug): the strict checker over
the shipped catalog stops the engine at the first event that shows each one and names the
invariant (docs/sglang.md §5). The same workloads on the correct engine are clean."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from engine.engine import Engine
from engine.memory import KVMemory
from engine.observe.memory_view import memory_view
from engine.request import Req, SamplingParams
from engine.speculative import accounting
from invariants.checking.checker import Checker, CheckerHook, InvariantViolation, Level, Violation
from invariants.checking.loader import CATALOG_DIR, Catalog, load_catalog
from invariants.mutants import mutant
from invariants.mutants.planted import OVERSHOOT_MEMORY, overshoot_req
from invariants.mutants.speculative import trim_leaving_swa_cursor
from tests.engine.speculative.spec_support import prompts, small_config

CATALOG = load_catalog()
NO_SPEC_RULES = load_catalog([CATALOG_DIR / "memory.yaml", CATALOG_DIR / "sched.yaml"])
SPEC = load_catalog([CATALOG_DIR / "speculative.yaml"])


def _without(rule_id: str) -> Catalog:
    """The shipped catalog less one rule (to show what fires behind it)."""
    return Catalog(tuple(r for r in CATALOG if r.id != rule_id))


def _first_violation(
    version: int,
    *,
    retract: bool = False,
    strict: bool = True,
    catalog: Any = CATALOG,
    max_new: int = 20,
) -> Violation | None:
    """Eight requests (page size 4, radix, chunked prefill, EAGLE 3 steps, acceptance 0.8)
    under a level-2 checker; the violation that stopped the engine, if any."""
    config = small_config(version, retract=retract, strict=strict)
    engine = Engine(config, observers=[CheckerHook(Checker(catalog, Level.STRICT))])
    try:
        engine.generate(prompts(1, 8, 24, 10, 50), SamplingParams(max_new_tokens=max_new))
    except InvariantViolation as caught:
        return caught.violation
    return None


def test_catalog_has_the_speculative_invariants() -> None:
    """speculative.yaml ships the EAGLE rules, each with a title, an origin and fixtures."""
    assert {
        "spec.overalloc_bounded",
        "spec.verify_window_allocated",
        "spec.committed_tracks_device",
        "req.finished_commits_only_returned_tokens",
    } <= set(SPEC.ids)
    assert all(
        rule.title and rule.origin and set(rule.fixtures) == {"pass", "fail"} for rule in SPEC
    )


def test_v2_prepare_preclaims_the_bonus_slot() -> None:
    """#22651: prepare reserved the window but did not count the bonus slot as committed;
    the resolve added the whole accept_len. Committed lags the device by one token, so the
    over-allocation reaches 2 * alloc_len: spec.overalloc_bounded (or, the bound aside,
    spec.committed_tracks_device) fires on the first decode step."""
    with mutant("22651-bonus-lag").patch():
        found = _first_violation(2)
        lagging = _first_violation(2, catalog=_without("spec.overalloc_bounded"))
    assert found is not None and found.invariant == "spec.overalloc_bounded"
    assert lagging is not None and (lagging.invariant, lagging.event) == (
        "spec.committed_tracks_device",
        "step",
    )


def test_v2_finished_request_is_trimmed_to_its_returned_tokens() -> None:
    """#22897: a v2 request finished with everything its last round accepted — committed
    and allocated past origin + finished_len. Released untrimmed, it holds over-allocated KV
    (req.committed_eq_allocated_at_release) for tokens nobody returns
    (req.finished_commits_only_returned_tokens)."""
    with mutant("22897-overshoot-untrimmed").patch():
        found = _first_violation(2)
        kept = _first_violation(2, catalog=_without("req.committed_eq_allocated_at_release"))
    assert found is not None and found.event == "step"
    assert found.invariant in {
        "req.committed_eq_allocated_at_release",
        "req.finished_commits_only_returned_tokens",
    }
    assert kept is not None and kept.invariant == "req.finished_commits_only_returned_tokens"


@pytest.mark.parametrize(
    "trim", [accounting.trim_overshoot, trim_leaving_swa_cursor], ids=["fixed", "pre_22900"]
)
def test_v2_trim_caps_the_swa_cursor(trim: Callable[[KVMemory, Req], None]) -> None:
    """#22900: the trim left swa_evicted_seqlen (40) above the target (38): the SWA KV the
    cursor claims freed lies past the committed KV (req.swa_evicted_le_committed). The fix
    caps the cursor — floored to a page so it stays aligned (committed 36)."""
    mem = KVMemory.from_config(OVERSHOOT_MEMORY)
    req = overshoot_req(mem)  # the bug zoo's planted #22900 request (one definition)
    trim(mem, req)
    # checked between the trim and the release (so not req.finished_released's business)
    found = Checker(_without("req.finished_released"), Level.RECORD).check(
        "step", memory_view(mem, "step", 1, [req])
    )
    ids = {v.invariant for v in found}
    if trim is accounting.trim_overshoot:
        assert ids == set() and (req.kv_committed_len, req.swa_evicted_seqlen, req.output_ids) == (
            36,
            36,
            [1, 2],
        )
    else:
        assert "req.swa_evicted_le_committed" in ids


@pytest.mark.parametrize("version", [1, 2])
def test_eagle_release_frees_the_reservation_from_ceil_committed(version: int) -> None:
    """#22862, the speculative source: a request released while it holds a reservation
    (retracted under v2; v1 trims after each verify through the same page-aligned free)
    must free [ceil(committed), allocated). Skipping it leaks the draft slots
    (pool.busy_sum / census.no_orphans); starting at floor(committed) frees the page that
    holds committed KV twice (non-strict allocator: pool.busy_sum / census.free_list_unique)."""
    with mutant("22862-spec-tail-leak").patch():
        leak = _first_violation(version, retract=True)
    assert leak is not None and leak.invariant in {"pool.busy_sum", "census.no_orphans"}
    with mutant("22862-tail-free-from-floor").patch():
        double = _first_violation(version, retract=True, strict=False)
    assert double is not None and double.invariant in {
        "pool.busy_sum",
        "census.free_list_unique",
        "kv.integrity",
    }


def test_v2_reservation_covers_the_next_verify_window() -> None:
    """Reserving one window (committed + alloc_len) instead of two leaves the in-flight
    round's accepted tokens outside the allocation: the next verify would write past it
    (spec.verify_window_allocated, at the schedule event, before any KV is written)."""
    with mutant("eagle-v2-one-window").patch():
        found = _first_violation(2)
    assert found is not None and (found.invariant, found.event) == (
        "spec.verify_window_allocated",
        "schedule",
    )


def test_v1_commit_frees_the_rejected_tail() -> None:
    """v1's verify trims allocated to committed; one that forgets to free the rejected tail
    leaks its pages (pool.busy_sum, at the end of the step)."""
    with mutant("eagle-v1-trim-leak").patch():
        found = _first_violation(1)
    assert found is not None and (found.invariant, found.event) == ("pool.busy_sum", "step")


def test_v1_rejected_draft_kv_is_never_read_as_committed() -> None:
    """A v1 commit that counts the first rejected draft's position as committed: the CPU
    runs ahead of the verified length (spec.committed_tracks_device at that step); without
    the speculative rules the sim model reads the rejected draft's KV where the bonus token
    belongs at the next forward (kv.integrity)."""
    with mutant("eagle-v1-commit-ahead").patch():
        found = _first_violation(1)
        read = _first_violation(1, catalog=NO_SPEC_RULES)
    assert found is not None and (found.invariant, found.event) == (
        "spec.committed_tracks_device",
        "step",
    )
    assert read is not None and (read.invariant, read.event) == ("kv.integrity", "forward")


def test_the_unplanted_runs_are_clean() -> None:
    """The workloads above on the correct engine violate nothing."""
    for version in (1, 2):
        assert _first_violation(version) is None
        assert _first_violation(version, retract=True) is None
        assert _first_violation(version, retract=True, strict=False) is None
        assert _first_violation(version, catalog=NO_SPEC_RULES) is None
