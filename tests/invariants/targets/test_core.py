"""The engine-neutral core of the real-engine targets, on a toy driver (fake/): a trace means on a
target what it means on kvspec's runner, a crash in the engine's code is the ``crash`` event
with a whole failure key, a refused op is the run's error, and every set-up problem is one
exception that names it — whatever the engine."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from invariants.checking.loader import shipped_catalog
from invariants.scenarios.ops import ForceRetract, Idle, Step, Submit, Trace, WaitFor
from invariants.targets.driver import AdapterDrift, TargetUnavailable
from invariants.targets.explore import failure_key
from invariants.targets.registry import TargetOptions
from invariants.targets.run import run_trace
from tests.invariants.targets.fake.adapter import DRIVER, FAKE

CATALOG = shipped_catalog()


def run(ops: list, behaviour: dict | None = None, level: int = 2):
    trace = Trace(name="t", ops=ops)
    return run_trace(FAKE, trace, CATALOG, level, fault=behaviour)


def wrapper(tmp_path: Path, flag: str) -> str:
    """An interpreter that runs the fake driver with ``flag``."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {DRIVER} {flag}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_trace_runs_to_idle_and_a_wait_that_runs_out_lets_it_go_on():
    """Submit, a wait_for shorter than the request (kvspec's runner: the client stops waiting,
    no failure), the drain to idle: clean, every step's view checked, the driver's counts."""
    ops = [Submit(rid="r", input_ids=[1, 2], max_new_tokens=5), WaitFor(rids=["r"], max_steps=2)]
    outcome = run(ops)
    assert outcome.ok and outcome.error is None and outcome.stopped_at is None
    assert outcome.stats.steps == 5 and outcome.stats.finished == 0
    assert outcome.checks > 0 and outcome.version == "1.0"


def test_a_crash_in_the_engines_code_is_the_crash_event_with_a_whole_key():
    """The engine raised at step 2: ``engine.exception`` fires on the crash record, the error
    names the op and the raising line, and the key carries the site, never cut."""
    outcome = run([Submit(rid="r", input_ids=[1], max_new_tokens=9), Step(n=3)], {"crash_at": 2})
    assert [v.invariant for v in outcome.violations] == ["engine.exception"]
    assert outcome.crash is not None and outcome.crash.site == "fake_engine/sched.py:take"
    assert failure_key(outcome) == "engine.exception@fake_engine/sched.py:take"
    assert outcome.error and outcome.error.startswith("op #1 (step")
    assert "[raised at fake_engine/sched.py:7 in take]" in outcome.error
    assert outcome.stopped_at == 1 and not outcome.ok


def test_a_violating_view_ends_the_run_at_the_op_it_answered():
    """Each view is checked while the driver runs the next step; the run ends at the first
    violating view — the op it answered, not the step run meanwhile — and the views after it
    (every one from step 1 on breaks the pool's sums here) are not checked."""
    submit = [Submit(rid=r, input_ids=[1], max_new_tokens=9) for r in ("r", "s")]
    ops = [submit[0], Step(n=1), submit[1], Step(n=1), Step(n=1)]
    outcome = run(ops, {"leak_from": 1})
    assert outcome.stopped_at == 1 and not outcome.ok and outcome.error is None
    assert {v.step for v in outcome.violations} == {1}


def test_a_crash_after_the_run_ended_is_not_the_runs():
    """The step the driver ran while the violating view was checked crashed: the run ended
    before it, so neither the crash nor its error is the run's."""
    ops = [Submit(rid="r", input_ids=[1], max_new_tokens=9), Step(n=1), Step(n=1)]
    outcome = run(ops, {"leak_from": 1, "crash_at": 2})
    assert outcome.stopped_at == 1 and outcome.crash is None and outcome.error is None
    assert {v.step for v in outcome.violations} == {1}
    assert "engine.exception" not in {v.invariant for v in outcome.violations}


def test_a_refused_op_is_the_runs_error_keyed_by_its_exception():
    """The driver refused a step (a mapping error, not the engine's): the run's error, keyed
    ``error:`` and the exception's class; no violation is made up."""
    outcome = run([Submit(rid="r", input_ids=[1], max_new_tokens=9), Step(n=3)], {"refuse_at": 1})
    assert not outcome.violations and outcome.crash is None
    assert failure_key(outcome) == "error:KeyError"


def test_a_refused_submit_posted_ahead_is_named_by_its_own_op():
    """A submit is posted without waiting for its answer (collected before the next op's):
    the driver's refusal of it is the run's error at that submit's op, not at the op asked
    when it was read, and the driver's later answers are read and dropped — the same driver
    runs the next trace in step."""
    ops = [Submit(rid=r, input_ids=[1], max_new_tokens=2) for r in ("r", "s", "t")]
    trace = [ops[0], Step(n=1), ops[1], ops[2], Step(n=1)]
    outcome = run(trace, {"refuse_rid": "s"})
    assert outcome.error and outcome.error.startswith("op #2 (submit")
    assert "s is too long" in outcome.error and outcome.stopped_at == 2
    with FAKE.adapter().open_driver(TargetOptions()) as driver:
        for behaviour in ({"refuse_rid": "s"}, None):
            outcome = run_trace(
                FAKE, Trace(name="t", ops=trace), CATALOG, driver=driver, fault=behaviour
            )
        assert outcome.ok and outcome.stats.steps == 3


def test_an_engine_that_never_idles_is_liveness():
    """An explicit idle that runs out of steps stops the run: ``liveness``."""
    outcome = run(
        [Submit(rid="r", input_ids=[1], max_new_tokens=1), Idle(max_steps=3)], {"never_idle": True}
    )
    assert failure_key(outcome) == "liveness" and "not idle after 3 steps" in (outcome.error or "")


def test_the_engines_own_checker_is_a_finding_of_its_own():
    """A message of the engine's own checker at a step kvspec found clean fails the run and
    keys it by the message's words, counts left out."""
    outcome = run([Submit(rid="r", input_ids=[1], max_new_tokens=1)], {"says": ["leak of 12 ok"]})
    assert not outcome.ok and outcome.findings[0].message == "leak of 12 ok"
    assert failure_key(outcome) == "fake:leak of ok"


def test_what_a_target_cannot_express_is_said_before_any_driver_starts():
    """An op the adapter refuses: the reasons, no run, never ok."""
    trace = Trace(name="t", ops=[ForceRetract()])
    outcome = run_trace(FAKE, trace, CATALOG, options=TargetOptions(python="/nonexistent"))
    assert outcome.unsupported and not outcome.ok and outcome.checks == 0


@pytest.mark.parametrize(
    ("flag", "raised", "said"),
    [
        ("--drift", AdapterDrift, "fake 9.9: AttributeError: no attribute 'recv_requests'"),
        ("--die", TargetUnavailable, "exited (3) during startup: ImportError: no module named"),
    ],
)
def test_set_up_problems_are_one_exception_naming_them(tmp_path, flag, raised, said):
    """A driver whose release moved under its adapter is AdapterDrift; one that dies is
    TargetUnavailable with the last words of its stderr."""
    options = TargetOptions(python=wrapper(tmp_path, flag))
    with pytest.raises(raised) as caught:
        run_trace(FAKE, Trace(name="t", ops=[]), CATALOG, options=options)
    assert said in str(caught.value)
