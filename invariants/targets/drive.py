"""One trace through one driver, every view checked: the config op, each op, the drain to idle.

Keeps: the trace means on a real engine what it means on kvspec's runner
(``scenarios/trace_run.py``) — a reused rid is skipped, a ``wait_for`` that runs out of steps
lets the trace go on (a client stops waiting; no failure), a drain that does not reach idle
is the run's error (``not idle after``: liveness), and a wait or drain in which requests are
owed but none finishes for ``STALL_STEPS`` steps is a stall — the ``crash`` event,
``engine.stall``, after its steps' views are checked; every view is checked, in order, while
the driver runs the next step (two processes on two cores) — a submit's or an abort's answer
is not waited for, but read before the next op's, so that the driver takes them in while the
views before them are checked (a refusal is still named with its own op) — and under
``stop_at_first`` the run ends at the first violating view (every invariant of that view is
evaluated): the ops the driver ran meanwhile — up to the next step — are not the run's, nor
is an error or crash they met. A crash in the engine's own code is checked as the ``crash``
event, as kvspec's engine's crashes are; a refused op is the run's error, named with its op.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from engine.view import CrashView, StateView
from invariants.checking.checker import Checker
from invariants.scenarios.ops import Idle, Op, Step, Submit, Trace, WaitFor, op_label
from invariants.scenarios.watchdog import named
from invariants.targets.driver import Answer, DriverError, EngineCrash, LineDriver, views_of
from invariants.targets.ops import op_message, output_rng, with_outputs
from invariants.targets.outcome import EngineFinding, TargetStats, crash_record
from invariants.targets.views import to_state_view

DRAIN_STEPS = 200_000  # a real engine's drain budget (kvspec's own: trace_run.drain_budget)
STALL_STEPS = 4_096  # steps with requests unfinished and none finishing: a stall
STALL_CHECK = 256  # steps between asks of which sent requests are unfinished
CRASH = "crash"
# allocations between young collections (Python's default: 700): a checked vLLM run at block
# size 1 keeps thousands of records alive a view, each walked by every young collection
# (100,000: checked ÷ unchecked 5–8% lower than at 20,000 on swa-hybrid, chunked-local,
# radix-eviction, paired in one process; docs/benchmarks.md)
YOUNG_GC = 100_000
CHECKED = "_checked"  # set in an answer once its views were checked
# ops whose answers nothing reads but the checks: posted without waiting, collected before the
# next op that is answered at once (the driver takes them in while the last views are checked)
POSTED_AHEAD = frozenset(("submit", "abort"))
OP_INDEX = "_op"  # set in an answer: the index of the trace op it answered


class Stalled(DriverError):
    """Work was owed and no request finished for ``STALL_STEPS`` steps of a wait or the drain
    (the views of those steps are checked before the stall is reported)."""


class _Progress:
    """Which sent requests are unfinished, asked every ``STALL_CHECK`` steps of one wait or
    drain: a stall when that set is non-empty and has not moved for ``STALL_STEPS``."""

    def __init__(self, stepper: Stepper) -> None:
        self.stepper, self.left, self.since = stepper, tuple[str, ...](), 0

    def check(self, step: int) -> None:
        """Raise ``Stalled`` once the unfinished set has sat still."""
        if (step + 1) % STALL_CHECK:
            return
        left = tuple(self.stepper.unfinished(self.stepper.sent))
        if left != self.left or not left:
            self.left, self.since = left, step
        elif step - self.since >= STALL_STEPS:
            raise Stalled(
                f"no request finished in {step - self.since} steps: unfinished {named(left)}"
            )


class Stepper:
    """One trace's ops on one driver; each call returns the answers of what it ran, in order
    (a step's: the views of the state it left, and the engine's own checkers' ``findings``)."""

    def __init__(
        self,
        driver: LineDriver,
        seed: int,
        draws_outputs: bool,
        behind: Callable[[Answer], object] | None = None,
    ) -> None:
        self.driver, self.used, self.sent = driver, set[str](), list[str]()
        self.rng = output_rng(seed) if draws_outputs else None
        self.steps = 0
        # ``behind`` takes the answers while the driver runs the next step (the checks run
        # beside the engine: two processes, two cores), in order; None: nothing to overlap
        self.behind = behind
        self.pending: list[Answer] = []  # answers collected, not yet handed behind
        self.posted: list[tuple[dict[str, Any], int]] = []  # (op, its index) not collected
        self.at = 0  # the trace op being applied (tags each answer: OP_INDEX)

    def ask(self, message: dict[str, Any]) -> Answer:
        """One op. With ``behind``, the answers collected so far go behind while the driver
        takes in the ops posted ahead and runs a step — what takes it long; a query is
        answered at once, and the answers wait for the next step (or ``flush``)."""
        if self.behind is None:
            return self.driver.ask(message)
        self.post(message)
        try:
            if message["op"] == "step":
                self.flush()
                self._collect(ahead=True)  # (answered before the step: checked while it runs)
                self.flush()
        finally:
            answer = self._collect()
        assert answer is not None  # (an error answer raised)
        return answer

    def post(self, message: dict[str, Any]) -> None:
        """Send one op; its answer is collected with the next op asked (``_collect``)."""
        self.driver.post(message)
        self.posted.append((message, self.at))

    def flush(self) -> None:
        """Hand every pending answer behind, in order."""
        pending, self.pending = self.pending, []
        for answer in pending:
            self.behind(answer)  # type: ignore[misc]

    def _collect(self, ahead: bool = False) -> Answer | None:
        """The answers of the ops posted, in order, into ``pending`` (``ahead``: all but the
        last op's); the last one collected. An error answer raises once the driver's other
        answers are read and dropped (its stream stays in step; the ops after the failed one
        are not the run's), with ``at`` its op's."""
        answer = None
        for _ in range(len(self.posted) - ahead):
            message, at = self.posted.pop(0)
            try:
                answer = self.driver.collect(message, lazy=True)  # views: decoded when checked
            except DriverError:
                self.at, posted, self.posted = at, self.posted, []
                for later, _ in posted:
                    with suppress(DriverError):
                        self.driver.collect(later, lazy=True)
                raise
            answer[OP_INDEX] = at
            self.pending.append(answer)
        return answer

    def apply(self, op: Op) -> list[Answer]:
        if isinstance(op, Step):
            return [self.step() for _ in range(op.n)]
        if isinstance(op, WaitFor):
            return self.wait_for(op.rids, op.max_steps)
        if isinstance(op, Idle):
            return self.drain(op.max_steps)
        message = op_message(op)
        if isinstance(op, Submit):
            if op.rid in self.used:  # kvspec skips a reused rid
                return []
            self.used.add(op.rid)
            if not op.input_ids:  # refused (400) before any scheduler sees it, as kvspec does
                return []
            self.sent.append(op.rid)
            message = message if self.rng is None else with_outputs(message, self.rng)
        if self.behind is not None and message["op"] in POSTED_AHEAD:
            self.post(message)  # (its answer: collected before the next op's)
            return []
        return [self.ask(message)]

    def step(self, plan: dict[str, Any] | None = None) -> Answer:
        """One iteration (``plan``: the batch to run, where the driver takes one)."""
        self.steps += 1
        return self.ask({"op": "step"} if plan is None else {"op": "step", "plan": plan})

    def idle(self) -> Answer | None:
        """The idle answer (its view the idle event's) when the engine is idle, else None."""
        answer = self.ask({"op": "idle"})
        return answer if answer["result"] else None

    def unfinished(self, rids: list[str]) -> list[str]:
        return list(self.ask({"op": "unfinished", "rids": rids})["result"])

    def wait_for(self, rids: list[str], max_steps: int) -> list[Answer]:
        answers: list[Answer] = []
        progress = _Progress(self)
        for step in range(max_steps):
            if not self.unfinished(rids):
                break
            answers.append(self.step())
            progress.check(step)
        return answers

    def drain(self, max_steps: int = DRAIN_STEPS) -> list[Answer]:
        """Step to idle; the last answer is the idle one. A step whose answer says the
        engine is not idle after it (``result: {"idle": false}``) needs no idle query before
        the next: steps follow steps, each checked while the driver runs the next."""
        answers: list[Answer] = []
        progress = _Progress(self)
        busy = False
        for step in range(max_steps):
            idle = None if busy else self.idle()
            if idle is not None:
                return [*answers, idle]
            answers.append(self.step())
            result = answers[-1].get("result")
            busy = isinstance(result, dict) and result.get("idle") is False
            progress.check(step)
        raise DriverError(f"not idle after {max_steps} steps")


@dataclass(slots=True)
class Drive:
    """What one drive did: the driver's counts (and the rest of its stats answer), the views
    kept, the engine's own findings, the error and crash, the op it stopped in (``len(ops)``:
    the drain; None: it ran to idle), and the config op's seconds (building the engine)."""

    stats: TargetStats = field(default_factory=TargetStats)
    details: dict[str, Any] = field(default_factory=dict)
    kept: list[StateView] = field(default_factory=list)
    findings: list[EngineFinding] = field(default_factory=list)
    error: str | None = None
    crash: CrashView | None = None
    stopped_at: int | None = None
    setup_seconds: float = 0.0


class _Checked:
    """The checking side of one drive: decode each view, check it, keep what was asked. An
    answer is checked once — as it arrives, or beside the next step (``one``, the stepper's
    ``behind``) — and none after the first violating view under ``stop_at_first``
    (``stopped_in``: the trace op that view answered)."""

    def __init__(
        self,
        checker: Checker | None,
        decode: Callable[[dict[str, Any]], StateView],
        drive: Drive,
        keep_views: bool,
        stop_at_first: bool,
    ) -> None:
        self.checker, self.decode, self.drive = checker, decode, drive
        self.keep_views, self.stop_at_first = keep_views, stop_at_first
        self.stopped = False
        self.stopped_in: int | None = None

    def __call__(self, answers: list[Answer]) -> bool:
        """Check every view of ``answers`` in order; True at the first violating one under
        ``stop_at_first`` (the views after it are not checked)."""
        for answer in answers:
            self.one(answer)
        return self.stopped

    def one(self, answer: Answer) -> None:
        """Check ``answer``'s views unless checked already or stopped."""
        if self.checker is None or self.stopped or answer.get(CHECKED):
            return
        answer[CHECKED] = True  # (an id would do only while the answer lives)
        views = [self.decode(raw) for raw in views_of(answer)]
        if views:
            at = views[0].step
            self.drive.findings += [EngineFinding(at, m) for m in answer.get("findings", ())]
        for view in views:
            if self.keep_views:
                self.drive.kept.append(view)
            if self.checker.check(view.event, view) and self.stop_at_first:
                self.stopped, self.stopped_in = True, answer.get(OP_INDEX, 0)
                return

    def crash(self, record: CrashView, step: int) -> None:
        """The crash event: a view of the crash record alone (the engine's state is gone)."""
        self.drive.crash = record
        if self.checker is not None:
            self.checker.check(CRASH, StateView(event=CRASH, step=step, crash=(record,)))


def drive_trace(
    driver: LineDriver,
    trace: Trace,
    config: dict[str, Any],
    checker: Checker | None,
    *,
    keep_views: bool = False,
    stop_at_first: bool = False,
    decode: Callable[[dict[str, Any]], StateView] = to_state_view,
    draws_outputs: bool = False,
) -> Drive:
    """The config op, every op of ``trace``, the drain to idle, each view (``decode`` makes it
    a StateView) through ``checker`` (None: unchecked); the driver's trace ended after."""
    _settle_heap()
    drive = Drive()
    check = _Checked(checker, decode, drive, keep_views, stop_at_first)
    behind = check.one if checker is not None else None
    stepper = Stepper(driver, trace.seed, draws_outputs, behind)
    began = time.perf_counter()
    try:
        stopped = check([driver.ask(config)])
        drive.setup_seconds = time.perf_counter() - began
        drive.stopped_at = 0 if stopped else _run_ops(stepper, trace, check, drive)
    except DriverError as exc:
        stepper.flush()  # the views before the error or crash, then it
        if check.stopped:  # the run ended at an earlier view: the op that failed is not its
            drive.stopped_at = check.stopped_in
        else:
            drive.error = str(exc)
            if isinstance(exc, EngineCrash):
                check.crash(crash_record(exc.crash), stepper.steps)
    drive.stats, drive.details = _stats(driver, stepper)
    driver.end()
    return drive


def _settle_heap() -> None:
    """Once a process: the heap as it stands (imports — torch, numpy, pydantic — and the
    catalog) frozen out of every later collection, and young collections every ``YOUNG_GC``
    allocations: a checked step allocates hundreds of short-lived records a view, and each
    full collection walked the whole start-up heap (1.2 ms a step of matrix-base on vLLM,
    measured; the same policy as the drivers' and vLLM's own engine core: gc.freeze)."""
    if gc.get_freeze_count():
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GC, *gc.get_threshold()[1:])


def _run_ops(stepper: Stepper, trace: Trace, check: _Checked, drive: Drive) -> int | None:
    """Each op, then the drain; the index of the op whose view stopped the run (None: it ran
    to idle). An op's views are checked while the driver runs the next step, so the run
    stops after that step: the views after the first violating one are not checked."""
    ops = [*trace.ops, None]
    for index, op in enumerate(ops):
        drive.stopped_at = stepper.at = index
        try:
            stepper.drain() if op is None else stepper.apply(op)
        except Stalled as exc:
            stepper.flush()
            if check.stopped:
                return check.stopped_in
            stall = {"kind": "stall", "error": "Stalled", "message": str(exc)}
            raise EngineCrash(f"{_where(index, op)}: {exc}", stall) from None
        except DriverError as exc:  # (its op: an op posted ahead, answered since)
            drive.stopped_at = failed = stepper.at
            where = _where(failed, ops[failed])
            if isinstance(exc, EngineCrash):
                raise EngineCrash(f"{where}: {exc}", exc.crash) from None
            raise DriverError(f"{where}: {exc}") from None
        if check.stopped:
            return check.stopped_in
    stepper.flush()
    return check.stopped_in


def _where(index: int, op: Op | None) -> str:
    return "the drain" if op is None else f"op #{index} ({op_label(op)})"


def _stats(driver: LineDriver, stepper: Stepper) -> tuple[TargetStats, dict[str, Any]]:
    """The driver's counts and the rest of its stats answer; only the steps this side took
    when the driver cannot answer (its trace ended with a crash, or never configured)."""
    try:
        result = dict(driver.ask({"op": "stats"})["result"])
    except DriverError:
        return TargetStats(steps=stepper.steps), {}
    return TargetStats(**result.pop("counts")), result
