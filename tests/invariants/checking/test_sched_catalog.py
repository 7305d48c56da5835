"""The scheduler catalog (invariants/checking/catalog/sched.yaml) and the view fields it reads:
every rule holds on views built without a scheduler, the engine fills the new fields (placement
flags, releases, row reuse, integrity failures) from real runs, and each rule fires on the engine
state it describes. (Every rule's pass/fail fixtures run in test_memory_catalog.py, which is
parametrized over the whole shipped catalog.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.model.runner import ForwardBatch, ForwardOutput
from engine.request import SamplingParams
from engine.view import ReleasedView, ReuseView, StateView
from invariants.checking.checker import Checker, CheckerHook, InvariantViolation, Level, run_fixture
from invariants.checking.loader import CATALOG_DIR, load_catalog

CATALOG = load_catalog()
SCHED = load_catalog([CATALOG_DIR / "sched.yaml"])
REQUIRED = {
    "sched.busy_set_covers_live",
    "req.committed_eq_allocated_at_release",
    "req.reuse_chunked_or_committed",
    "sched.single_chunked",
    "kv.integrity",
    "req.release_insert_iff_finished",
    "req.committed_at_release_matches_tokens",
    "sched.chunked_in_batch",
    "req.finished_released",
    "req.retracted_released",
    "sched.batch_reqs_hold_rows",
    "sched.idle_nothing_live",
}


def _engine(
    *,
    overlap: bool = False,
    chunk: int | None = None,
    retract: bool = False,
    observers: tuple[Any, ...] = (),
    runner: Any = None,
) -> Engine:
    mem = MemoryConfig(page_size=4, max_total_tokens=2048, max_num_reqs=8, context_len=512)
    config = EngineConfig(
        memory=mem,
        enable_overlap=overlap,
        chunked_prefill_size=chunk,
        test_retract=retract,
        test_retract_interval=2,
    )
    return Engine(config, observers=observers, runner=runner)


def _prompt(seed: int, n: int) -> list[int]:
    return [(seed * 31 + i * 7) % 256 for i in range(n)]


class ViewLog:
    """An observer that keeps the view of every event it is given."""

    def __init__(self, events: frozenset[str]) -> None:
        self.events = events
        self.views: list[StateView] = []

    def on_event(self, event: str, engine: Any) -> None:
        if event in self.events:
            self.views.append(engine.state_view(event))


def test_catalog_has_the_scheduler_invariants() -> None:
    """Every scheduler invariant of the brief is in sched.yaml, with a title and an origin."""
    assert REQUIRED <= set(SCHED.ids) and set(SCHED.ids) <= set(CATALOG.ids)
    assert all(
        rule.title and rule.origin and set(rule.fixtures) == {"pass", "fail"} for rule in SCHED
    )


@pytest.mark.parametrize("rule_id", SCHED.ids)
def test_rule_holds_on_a_view_without_scheduler_fields(rule_id: str) -> None:
    """A view built without a scheduler (memory_view alone, an adapter) leaves every new field
    at its default; no scheduler rule may fire on it at any of its events."""
    rule = SCHED.get(rule_id)
    for event in sorted(rule.events):
        assert Checker([rule]).check(event, StateView(event=event)) == ()


def test_integrity_message_names_request_position_slot_and_pool() -> None:
    """A KV integrity violation says which request read which position from which slot."""
    (found,) = run_fixture(CATALOG, CATALOG.get("kv.integrity").fixtures["fail"])
    assert found.message == (
        "req r1 read position 5 from full slot 37: expected fingerprint 11, found 0"
        " (never written or freed and reset)"
    )


def test_placement_flags_and_token_counts() -> None:
    """A decoding request is flagged running and in this iteration's batch, not waiting, with
    its prompt and output lengths."""
    engine = _engine()
    engine.submit(_prompt(0, 20), SamplingParams(max_new_tokens=8))
    engine.step()
    engine.step()
    (req,) = engine.state_view("step").reqs
    assert (req.in_waiting, req.in_running, req.in_batch) == (False, True, True)
    assert (req.origin_len, req.num_output, req.finished, req.to_finish) == (20, 2, False, False)
    engine.abort(req.rid)
    assert engine.state_view("step").reqs[0].to_finish


def test_releases_are_recorded_as_they_happen() -> None:
    """Each iteration's releases reach the step view: finished requests are inserted, forced
    retracts freed, and without speculation committed == allocated at every release."""
    log = ViewLog(frozenset({"step"}))
    engine = _engine(retract=True, observers=(log, CheckerHook(Checker(CATALOG, Level.STRICT))))
    for i in range(4):
        engine.submit(_prompt(i, 24 + i), SamplingParams(max_new_tokens=12))
    engine.run_until_idle()
    released: list[ReleasedView] = [r for view in log.views for r in view.sched.released]
    assert {(r.finished, r.is_insert) for r in released} == {(True, True), (False, False)}
    assert all(r.kv_committed_len == r.kv_allocated_len and r.req_pool_idx > 0 for r in released)
    assert sum(r.finished for r in released) == 4


def test_continuing_chunks_are_recorded_as_row_reuse() -> None:
    """Every chunk after the first arrives at prepare_for_extend with its row set: recorded in
    the schedule view, still chunked or holding committed KV (INV-REQPOOL-REUSE)."""
    log = ViewLog(frozenset({"schedule"}))
    engine = _engine(chunk=32, observers=(log,))
    rid = engine.submit(_prompt(1, 150), SamplingParams(max_new_tokens=2))
    engine.run_until_idle()
    reuse: list[ReuseView] = [r for view in log.views for r in view.sched.reuse]
    assert [r.kv_committed_len for r in reuse] == [32, 64, 96, 128]
    assert {r.rid for r in reuse} == {rid} and all(
        r.is_chunked > 0 or r.kv_committed_len > 0 for r in reuse
    )
    chunked = [view.sched.batch_chunked_rids for view in log.views]
    assert chunked[:4] == [(rid,)] * 4 and chunked[4] == ()


def test_corrupted_kv_stops_the_engine_at_the_forward_that_reads_it() -> None:
    """A KV slot overwritten behind the engine's back fails kv.integrity at the next forward
    that reads it, naming the request, the position and the slot."""
    engine = _engine(observers=(CheckerHook(Checker(CATALOG, Level.STRICT)),))
    rid = engine.submit(_prompt(2, 20), SamplingParams(max_new_tokens=8))
    engine.step()
    req = engine.requests[rid]
    slot = int(engine.mem.req_to_token_pool.req_to_token[req.req_pool_idx, 5])
    engine.runner.kv.full[slot] = 1
    with pytest.raises(InvariantViolation) as caught:
        engine.step()
    found = caught.value.violation
    assert (found.invariant, found.event) == ("kv.integrity", "forward")
    assert found.message.startswith(f"req {rid} read position 5 from full slot {slot}: ")


class PlainRunner:
    """A runner with only ``forward`` (no integrity reporting), like a real model."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        return self.inner.forward(batch)


def test_a_runner_without_integrity_reporting_gives_no_failures() -> None:
    """The integrity plumbing is optional: a runner that does not offer
    ``take_integrity_failures`` runs, and its forward views carry no failures."""
    donor = _engine()
    log = ViewLog(frozenset({"forward"}))
    engine = _engine(observers=(log,), runner=PlainRunner(donor.runner))
    engine.generate([_prompt(3, 16)], SamplingParams(max_new_tokens=4))
    assert log.views and all(view.integrity == () for view in log.views)


def test_a_waiting_request_holding_a_row_breaks_the_busy_set() -> None:
    """Moving a decoding request back to the waiting queue without releasing it (a lost
    release) leaves its row outside SGLang's busy-check set: sched.busy_set_covers_live."""
    engine = _engine()
    engine.submit(_prompt(4, 20), SamplingParams(max_new_tokens=8))
    engine.step()
    engine.step()
    sched = engine.scheduler
    req = sched.running_batch.reqs.pop()
    sched.waiting_queue.append(req)
    found = Checker(CATALOG).check("step", engine.state_view("step"))
    assert [v.invariant for v in found] == ["sched.busy_set_covers_live"]
    assert found[0].message.startswith(
        f"req {req.rid} holds row {req.req_pool_idx} from the waiting queue"
    )


def test_catalog_file_is_the_one_loaded() -> None:
    """sched.yaml sits in the shipped catalog directory (the checker loads it by default)."""
    assert str(Path(CATALOG_DIR) / "sched.yaml") in CATALOG.paths
