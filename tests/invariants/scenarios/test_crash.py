"""Crashes are findings: an exception inside an engine operation becomes the ``crash`` event,
checked like any other — the ``engine.*`` rule names its kind, the census names the pages at
that moment — and the explorer keys, shrinks and replays it like a violation."""

from __future__ import annotations

import pytest

from engine.engine import SchedulerStall
from engine.errors import KVAccountingError, KVOutOfMemory
from engine.mem.allocator import PagedAllocator
from engine.sched.stats import SchedulerError
from invariants.checking.loader import shipped_catalog
from invariants.explore.explorer import failure_key
from invariants.scenarios.crash import DrainStuck, crash_kind, crash_view
from invariants.scenarios.ops import Step, Submit, Trace, WaitFor
from invariants.scenarios.spec import EngineSpec
from invariants.scenarios.trace_run import run_trace

ENGINE = EngineSpec(max_total_tokens=256, context_len=128, page_size=4, cache="chunk")
TRACE = Trace(
    engine=ENGINE,
    ops=[
        Submit(rid="a", input_ids=list(range(1, 10)), max_new_tokens=3),
        WaitFor(rids=["a"]),
        Submit(rid="b", input_ids=list(range(20, 30)), max_new_tokens=3),
        Step(n=8),
    ],
)


@pytest.mark.parametrize(
    "exc,kind",
    [
        (KVOutOfMemory("decode"), "out_of_memory"),
        (KVAccountingError("double free"), "accounting"),
        (SchedulerStall("stalled"), "stall"),
        (DrainStuck("not idle"), "stall"),
        (SchedulerError("second chunk"), "exception"),
        (ValueError("bad batch"), "exception"),
    ],
)
def test_the_kind_of_a_crash_is_its_exception_class(exc: Exception, kind: str) -> None:
    """Out of memory before accounting (it is a subclass); a stall or a stuck drain is a
    liveness crash; anything else is an exception."""
    assert crash_kind(exc) == kind


def test_an_accounting_error_carries_the_pages_its_raiser_named() -> None:
    """The allocator's strict guard names the pool and the pages of a double free."""
    alloc = PagedAllocator(32, 4)
    slots = alloc.alloc(8)
    assert slots is not None
    alloc.free(slots)
    with pytest.raises(KVAccountingError) as raised:
        alloc.free(slots[:4])
    record = crash_view(raised.value)
    assert (record.kind, record.pool, record.pages) == ("accounting", "full", (1,))
    assert record.message == "full: double free of page(s) [1]"


def test_a_double_free_is_a_named_finding_with_the_census_at_that_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A release that frees its pages twice raises inside the allocator; the run reports
    ``engine.accounting_error`` at the crash event (at level 2 too), naming the page, and the
    explorer keys the failure by it; the outcome still carries the error and its traceback."""
    real = PagedAllocator.free
    calls: list[int] = []

    def free_twice(self: PagedAllocator, indices) -> None:
        real(self, indices)
        calls.append(len(indices))
        if len(calls) == 1:
            real(self, indices)  # the bug: the same pages a second time

    monkeypatch.setattr(PagedAllocator, "free", free_twice)
    out = run_trace(TRACE, shipped_catalog(), stop_at_first=True)
    first = out.first_violation
    assert first is not None and first.invariant == "engine.accounting_error"
    assert first.event == "crash" and "double free of page(s)" in first.message
    assert failure_key(out) == "engine.accounting_error"
    assert out.error is not None and out.error.startswith("KVAccountingError") and not out.ok


def test_a_crash_that_leaves_a_page_unowned_has_the_census_name_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A release that raises after dropping the request's row (its pages never freed): the
    crash event's census names the leaked pages beside the crash rule."""
    from engine.memory import KVMemory

    def release_and_raise(self: KVMemory, req, *args, **kwargs) -> None:
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        raise SchedulerError(f"release of {req.rid} failed half-way")

    monkeypatch.setattr(KVMemory, "release_kv_cache", release_and_raise)
    out = run_trace(TRACE, shipped_catalog(), stop_at_first=True)
    fired = {v.invariant for v in out.violations if v.event == "crash"}
    assert fired == {"engine.exception", "census.no_orphans"}
    orphans = next(v for v in out.violations if v.invariant == "census.no_orphans")
    assert "leaked pages" in orphans.message
