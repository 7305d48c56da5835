"""Historical-style scheduler bugs, planted for one test from the bug zoo's registry
(invariants/mutants: one definition of each bug): the strict
checker over the shipped catalog stops the engine at the first event that shows each one,
and names the invariant a reader would look for."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.request import SamplingParams
from invariants.checking.checker import Checker, CheckerHook, InvariantViolation, Level, Violation
from invariants.checking.loader import load_catalog
from invariants.mutants import BUGS_DIR, mutant
from invariants.scenarios.runner import run_spec
from invariants.scenarios.spec import load_spec

CATALOG = load_catalog()


def _first_violation(
    *,
    retract_every: int | None = None,
    strict_allocator: bool = True,
    abort_after: int | None = None,
) -> Violation | None:
    """Run eight requests (page size 4, radix, no overlap) under the strict checker, aborting
    four of them after ``abort_after`` steps; the violation that stopped the engine, if any."""
    mem = MemoryConfig(
        page_size=4, max_total_tokens=1024, max_num_reqs=8, context_len=512, strict=strict_allocator
    )
    config = EngineConfig(
        memory=mem,
        enable_overlap=False,
        chunked_prefill_size=64,
        test_retract=retract_every is not None,
        test_retract_interval=retract_every or 3,
    )
    engine = Engine(config, observers=[CheckerHook(Checker(CATALOG, Level.STRICT))])
    rids = [
        engine.submit(
            [(7 * i + j) % 256 for j in range(30 + 9 * i)], SamplingParams(max_new_tokens=20)
        )
        for i in range(8)
    ]
    try:
        for _ in range(abort_after or 0):
            engine.step()
        for rid in rids[: 4 if abort_after else 0]:
            engine.abort(rid)
        engine.run_until_idle()
    except InvariantViolation as caught:
        return caught.violation
    return None


def test_retract_that_caches_its_kv_is_caught() -> None:
    """A retract that releases with ``is_insert=True`` keeps every sum balanced (the tree just
    grows) but breaks the release contract: req.release_insert_iff_finished."""
    with mutant("retract-inserts-kv").patch():
        found = _first_violation(retract_every=2)
    assert found is not None and (found.invariant, found.event) == (
        "req.release_insert_iff_finished",
        "step",
    )
    assert "finished=False" in found.message


def test_release_from_the_committed_page_start_is_caught() -> None:
    """Regression shape of #22862: the tail free starts at ``floor(committed)`` instead of
    ``ceil(committed)`` and frees the page that holds committed KV a second time. With the
    allocator's own double-free guard off, the counters and the census catch it at once."""
    with mutant("22862-tail-free-from-floor").patch():
        found = _first_violation(strict_allocator=False)
    assert (
        found is not None
        and found.invariant in {"pool.busy_sum", "census.free_list_unique"}
        and found.event == "step"
    )


def test_aborted_request_that_is_not_released_is_caught() -> None:
    """The abort leak of #22273: a running request finished by an abort is retired without
    releasing its KV. req.finished_released fires at the step event of that very iteration,
    before the leaked pages fall out of every batch and unbalance the sums."""
    with mutant("22273-abort-not-released").patch():
        found = _first_violation(abort_after=6)
    assert found is not None and (found.invariant, found.event) == ("req.finished_released", "step")
    assert "finished but still holds row" in found.message


def test_the_unplanted_runs_are_clean() -> None:
    """The same three workloads on the correct engine violate nothing (each mutant's finding
    is the mutant's, not the workload's)."""
    assert _first_violation(retract_every=2) is None
    assert _first_violation(strict_allocator=False) is None
    assert _first_violation(abort_after=6) is None


@pytest.mark.parametrize("page_size", [1, 4, 16, 64])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_a_swa_cursor_one_page_into_the_window_is_caught_at_every_page_size(
    page_size: int, overlap: bool
) -> None:
    """U13's off-by-one window on the eviction side (the cursor one page past SGLang's
    ``floor(seq_len - window - ps)``) frees the page holding the first key the next query
    reads: the model's own window finds it freed (``kv.integrity``) or the cursor bound names
    it (``req.swa_evicted_outside_window``), at every page size; under overlap the launched,
    unprocessed batch may read it first (``sched.inflight_reads_held``). The correct engine is
    clean."""
    spec = load_spec(BUGS_DIR / "u13-swa-cursor-into-window.yaml")
    pool = max(2048, 32 * page_size)
    engine = spec.engine.model_copy(
        update=dict(
            page_size=page_size,
            max_total_tokens=pool,
            swa_tokens=pool // 2,
            chunked_prefill_size=max(64, page_size),
            enable_overlap=overlap,
        )
    )
    spec = spec.model_copy(update={"engine": engine})
    assert run_spec(spec, CATALOG, Level.STRICT).ok
    with mutant("u13-swa-cursor-into-window").patch():
        out = run_spec(spec, CATALOG, Level.STRICT)
    assert out.violations, "the mutant freed nothing the window reads"
    found = {"kv.integrity", "req.swa_evicted_outside_window"}
    if overlap:
        found.add("sched.inflight_reads_held")
    assert out.violations[0].invariant in found


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_a_slide_that_forgets_the_batch_in_flight_is_caught_only_as_an_in_flight_read(
    overlap: bool,
) -> None:
    """A batch in flight is an owner: sliding the SWA window on the next batch's length frees,
    at page size 1, the first key the launched, unprocessed batch still reads. Under overlap
    sched.inflight_reads_held names the page, the batch and the request; without overlap no
    read touches it and every rule passes (what the issue measured); the correct engine is
    clean in both loops."""
    spec = load_spec(BUGS_DIR / "overlap-swa-slide-next-length.yaml")
    spec = spec.model_copy(
        update={"engine": spec.engine.model_copy(update={"enable_overlap": overlap})}
    )
    assert run_spec(spec, CATALOG, Level.STRICT).ok
    with mutant("overlap-swa-slide-next-length").patch():
        out = run_spec(spec, CATALOG)
    found = {v.invariant for v in out.violations}
    assert found == ({"sched.inflight_reads_held"} if overlap else set()), found
    if overlap:
        message = out.violations[0].message
        assert "launched batch #" in message and "reads swa slot" in message
        assert "freed by its own window slide" in message
