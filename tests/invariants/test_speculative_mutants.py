"""EAGLE's historical bugs, planted for one test with monkeypatch: the strict checker over
the shipped catalog stops the engine at the first event that shows each one and names the
invariant (research/sglang.md §5). The same workloads on the correct engine are clean."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from engine.config import MemoryConfig
from engine.engine import Engine
from engine.mem import paging
from engine.memory import KVMemory
from engine.request import Req, SamplingParams
from engine.snapshot import memory_view
from engine.speculative import accounting
from engine.speculative.eagle import EagleWorker
from invariants.checker import Checker, CheckerHook, InvariantViolation, Level, Violation
from invariants.loader import CATALOG_DIR, Catalog, load_catalog
from tests.engine.speculative.spec_support import prompts, small_config

CATALOG = load_catalog()
NO_SPEC_RULES = load_catalog([CATALOG_DIR / "memory.yaml", CATALOG_DIR / "sched.yaml"])
SPEC = load_catalog([CATALOG_DIR / "speculative.yaml"])


def _without(rule_id: str) -> Catalog:
    """The shipped catalog less one rule (to show what fires behind it)."""
    return Catalog(tuple(r for r in CATALOG if r.id != rule_id))


def _first_violation(version: int, *, retract: bool = False, strict: bool = True, catalog: Any = CATALOG,
                     max_new: int = 20) -> Violation | None:
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
    assert {"spec.overalloc_bounded", "spec.verify_window_allocated", "spec.committed_tracks_device",
            "req.finished_commits_only_returned_tokens"} <= set(SPEC.ids)
    assert all(rule.title and rule.origin and set(rule.fixtures) == {"pass", "fail"} for rule in SPEC)


def test_v2_prepare_preclaims_the_bonus_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """#22651: prepare reserved the window but did not count the bonus slot as committed;
    the resolve added the whole accept_len. Committed lags the device by one token, so the
    over-allocation reaches 2 * alloc_len: spec.overalloc_bounded (or, the bound aside,
    spec.committed_tracks_device) fires on the first decode step."""
    monkeypatch.setattr(accounting, "preclaim_bonus", lambda req: None)
    monkeypatch.setattr(accounting, "resolve_accepted",
                        lambda req, n: setattr(req, "kv_committed_len", req.kv_committed_len + n))
    found = _first_violation(2)
    assert found is not None and found.invariant == "spec.overalloc_bounded"
    lagging = _first_violation(2, catalog=_without("spec.overalloc_bounded"))
    assert lagging is not None and (lagging.invariant, lagging.event) == ("spec.committed_tracks_device", "step")


def test_v2_finished_request_is_trimmed_to_its_returned_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """#22897: a v2 request finished with everything its last round accepted — committed
    and allocated past origin + finished_len. Released untrimmed, it holds over-allocated KV
    (req.committed_eq_allocated_at_release) for tokens nobody returns
    (req.finished_commits_only_returned_tokens)."""
    monkeypatch.setattr(accounting, "trim_overshoot", lambda mem, req: None)
    found = _first_violation(2)
    assert found is not None and found.event == "step"
    assert found.invariant in {"req.committed_eq_allocated_at_release", "req.finished_commits_only_returned_tokens"}
    kept = _first_violation(2, catalog=_without("req.committed_eq_allocated_at_release"))
    assert kept is not None and kept.invariant == "req.finished_commits_only_returned_tokens"


def _overshoot_req(mem: KVMemory) -> Req:
    """A finishing v2 request (page size 4, window 8): prompt 36, 6 output tokens of which
    2 are returned (target 38), committed 42, reserved to 48, SWA KV freed up to 40 (the
    #22900 report: cursor 42 > target 38)."""
    req = Req("r", [(5 * i) % 256 for i in range(36)], sampling_params=SamplingParams(max_new_tokens=2))
    req.init_next_round_input(mem)
    mem.alloc_for_extend([req])
    accounting.extend_allocation(mem, [req], [48])
    req.output_ids = [1, 2, 3, 4, 5, 6]
    req.kv_committed_len = 42
    accounting.check_finished_each(req, 0)
    mem.allocator.free_swa(mem.req_to_token_pool.read(req.req_pool_idx, 0, 40))  # type: ignore[arg-type]
    req.swa_evicted_seqlen = 40
    return req


def _sglang_0_5_11_trim(mem: KVMemory, req: Req) -> None:
    """#22897's trim before #22900: free [ceil(target), allocated), cap committed and
    allocated at target — and leave the SWA cursor where it was."""
    target = len(req.origin_input_ids) + (req.finished_len or 0)
    start, end = paging.tail_free_range(target, req.kv_allocated_len, mem.page_size)
    mem.allocator.free(mem.req_to_token_pool.read(req.req_pool_idx, start, end))  # type: ignore[arg-type]
    req.kv_allocated_len = req.kv_committed_len = target
    del req.output_ids[req.finished_len or 0 :]


@pytest.mark.parametrize("trim", [accounting.trim_overshoot, _sglang_0_5_11_trim], ids=["fixed", "pre_22900"])
def test_v2_trim_caps_the_swa_cursor(trim: Callable[[KVMemory, Req], None]) -> None:
    """#22900: the trim left swa_evicted_seqlen (40) above the target (38): the SWA KV the
    cursor claims freed lies past the committed KV (req.swa_evicted_le_committed). The fix
    caps the cursor — floored to a page so it stays aligned (committed 36)."""
    mem = KVMemory.from_config(MemoryConfig(page_size=4, max_total_tokens=256, max_num_reqs=2, context_len=64,
                                            swa_tokens=256, sliding_window=8))
    req = _overshoot_req(mem)
    trim(mem, req)
    # checked between the trim and the release (so not req.finished_released's business)
    found = Checker(_without("req.finished_released"), Level.RECORD).check("step", memory_view(mem, "step", 1, [req]))
    ids = {v.invariant for v in found}
    if trim is accounting.trim_overshoot:
        assert ids == set() and (req.kv_committed_len, req.swa_evicted_seqlen, req.output_ids) == (36, 36, [1, 2])
    else:
        assert "req.swa_evicted_le_committed" in ids


@pytest.mark.parametrize("version", [1, 2])
def test_eagle_release_frees_the_reservation_from_ceil_committed(monkeypatch: pytest.MonkeyPatch,
                                                                 version: int) -> None:
    """#22862, the speculative source: a request released while it holds a reservation
    (retracted under v2; v1 trims after each verify through the same page-aligned free)
    must free [ceil(committed), allocated). Skipping it leaks the draft slots
    (pool.busy_sum / census.no_orphans); starting at floor(committed) frees the page that
    holds committed KV twice (non-strict allocator: pool.busy_sum / census.free_list_unique)."""
    monkeypatch.setattr(paging, "tail_free_range", lambda c, a, ps: (a, a))
    leak = _first_violation(version, retract=True)
    assert leak is not None and leak.invariant in {"pool.busy_sum", "census.no_orphans"}
    monkeypatch.setattr(paging, "tail_free_range", lambda c, a, ps: (c // ps * ps, max(a, c // ps * ps)))
    double = _first_violation(version, retract=True, strict=False)
    assert double is not None and double.invariant in {"pool.busy_sum", "census.free_list_unique", "kv.integrity"}


def test_v2_reservation_covers_the_next_verify_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reserving one window (committed + alloc_len) instead of two leaves the in-flight
    round's accepted tokens outside the allocation: the next verify would write past it
    (spec.verify_window_allocated, at the schedule event, before any KV is written)."""
    monkeypatch.setattr(accounting, "reserve_targets",
                        lambda reqs, v, n, a: [max(r.kv_allocated_len, r.kv_committed_len + a) for r in reqs])
    found = _first_violation(2)
    assert found is not None and (found.invariant, found.event) == ("spec.verify_window_allocated", "schedule")


def test_v1_commit_frees_the_rejected_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """v1's verify trims allocated to committed; one that forgets to free the rejected tail
    leaks its pages (pool.busy_sum, at the end of the step)."""
    monkeypatch.setattr(accounting, "trim_allocation",
                        lambda mem, req, n: setattr(req, "kv_allocated_len", n))
    found = _first_violation(1)
    assert found is not None and (found.invariant, found.event) == ("pool.busy_sum", "step")


def test_v1_rejected_draft_kv_is_never_read_as_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A v1 commit that counts the first rejected draft's position as committed: the CPU
    runs ahead of the verified length (spec.committed_tracks_device at that step); without
    the speculative rules the sim model reads the rejected draft's KV where the bonus token
    belongs at the next forward (kv.integrity)."""
    def ahead(self: EagleWorker, req: Req, tokens: list[int]) -> None:
        start = len(req.output_ids)
        for token in tokens:
            req.output_ids.append(token)
            req.check_finished()
            if req.finished():
                break
        rejected = not req.finished() and len(tokens) < self.spec.num_draft_tokens
        req.kv_committed_len += len(req.output_ids) - start + rejected
        accounting.trim_allocation(self.mem, req, req.kv_committed_len)

    monkeypatch.setattr(EagleWorker, "_commit_v1", ahead)
    found = _first_violation(1)
    assert found is not None and (found.invariant, found.event) == ("spec.committed_tracks_device", "step")
    read = _first_violation(1, catalog=NO_SPEC_RULES)
    assert read is not None and (read.invariant, read.event) == ("kv.integrity", "forward")


def test_the_unplanted_runs_are_clean() -> None:
    """The workloads above on the correct engine violate nothing."""
    for version in (1, 2):
        assert _first_violation(version) is None
        assert _first_violation(version, retract=True) is None
        assert _first_violation(version, retract=True, strict=False) is None
        assert _first_violation(version, catalog=NO_SPEC_RULES) is None
