"""A run that owes work but advances no request is stalled within a bounded number of
iterations (invariants/scenarios/watchdog.py): ``SchedulerStall`` at the engine's ``step``
event, the ``crash`` event, ``engine.stall`` naming the op and what waits — even where the
engine's own bound (two empty iterations) never trips because every iteration claims progress.
An engine that advances, or owes nothing, runs on."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine, SchedulerStall
from engine.request import SamplingParams
from invariants.checking.loader import shipped_catalog
from invariants.mutants import mutant
from invariants.mutants.base import BUGS_DIR
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import load_spec
from invariants.scenarios.trace_run import run_trace
from invariants.scenarios.watchdog import CHECK_EVERY, ProgressWatch

LIMIT = 64


def _engine() -> tuple[Engine, ProgressWatch]:
    watch = ProgressWatch(lambda: "op #0: test", limit=LIMIT)
    config = EngineConfig(memory=MemoryConfig(max_total_tokens=512, context_len=256))
    return Engine(config, observers=[watch]), watch


def test_an_engine_that_claims_progress_but_advances_nothing_is_stalled() -> None:
    """Nothing is ever scheduled, yet every iteration reports a relief (the wedge breaker's
    claim): the watch raises within LIMIT + CHECK_EVERY iterations, naming the waiting
    request and the op."""
    engine, _ = _engine()
    engine.submit([1, 2, 3, 4], SamplingParams(max_new_tokens=4), rid="r0")
    engine.scheduler.get_next_batch_to_run = lambda: None  # type: ignore[method-assign]
    engine.scheduler.wedge.after = lambda s, nothing: True  # type: ignore[method-assign]
    with pytest.raises(SchedulerStall, match=r"no request advanced in \d+ iterations") as info:
        for _ in range(LIMIT + 2 * CHECK_EVERY):
            engine.step()
    assert "waiting 1 [r0]" in str(info.value) and "op #0: test" in str(info.value)
    assert engine.scheduler.stats.iterations <= LIMIT + 2 * CHECK_EVERY


def test_an_advancing_engine_and_an_idle_one_run_on() -> None:
    """Long decodes (one token a step) and long idle stretches never trip the watch."""
    engine, _ = _engine()
    engine.submit([1, 2, 3], SamplingParams(max_new_tokens=4 * LIMIT, ignore_eos=True))
    for _ in range(4 * LIMIT + 8):
        engine.step()
    assert engine.is_idle()
    for _ in range(4 * LIMIT):
        engine.step()


def test_a_wedge_relief_that_reclaims_nothing_is_named_engine_stall() -> None:
    """The zoo's wedge-relief-claimed: a trace of a pool that wedges ends in the crash event
    with ``engine.stall``, long before its drain budget."""
    trace = build_trace(load_spec(BUGS_DIR / "wedge-relief-claimed.yaml"))
    with mutant("wedge-relief-claimed").patch():
        outcome = run_trace(trace, shipped_catalog())
    assert outcome.error is not None and outcome.error.startswith("SchedulerStall: no request")
    assert [v.invariant for v in outcome.violations] == ["engine.stall"]
    assert outcome.steps < 2_000
