"""Differential mode: one op trace through kvspec's engine and through real SGLang in
lockstep, the ownership buckets of every pool compared after every step.

Keeps: both sides make the same scheduling decisions, so a bucket that differs is a
difference of the memory code. kvspec's scheduler decides (overlap off, no mixed chunk, no
chunked prefill: the granularity the glue reproduces); each iteration's batch — an extend of
exactly these requests, a decode of all running, or nothing — is sent to the driver, which
runs it through SGLang's own match / lock / alloc / checkpoint / release. Every other op
(submit with session parameters, open/close, abort, clock) goes to both sides. Each
difference is reported with its step and op, declared by invariants/targets/sglang/gaps.py or not;
a schedule the glue cannot follow (a retraction, a rejected request SGLang prefills) ends
the run as an undeclared difference naming the op.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from engine.engine import Engine
from engine.hooks import SimClock
from engine.sched.sessions import SessionError
from engine.view import POOL_BUCKETS, SELECTIVE, StateView
from invariants.scenarios.ops import (
    Abort,
    AdvanceClock,
    CloseSession,
    Idle,
    Op,
    OpenSession,
    Step,
    Submit,
    Trace,
    WaitFor,
    op_label,
)
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import Spec
from invariants.targets.drive import DRAIN_STEPS, Stepper
from invariants.targets.driver import DriverError, LineDriver
from invariants.targets.registry import TargetOptions
from invariants.targets.sglang.adapter import config, open_driver, unsupported, unsupported_engine
from invariants.targets.sglang.gaps import declared
from invariants.targets.views import pool_buckets, to_state_view

POOL_PARTS = frozenset({SELECTIVE, "pools"})


@dataclass(frozen=True, slots=True)
class Difference:
    """One bucket (or the schedule) that differs at one step."""

    step: int
    op: str
    bucket: str  # ``free`` …, ``swa.free`` … for the SWA pool, or ``schedule``
    kvspec: int
    sglang: int
    gap: str | None  # the declared gap, or None: unexpected
    detail: str = ""

    def __str__(self) -> str:
        tag = f"declared: {self.gap}" if self.gap else "UNEXPECTED"
        what = self.detail or f"kvspec={self.kvspec} sglang={self.sglang}"
        return f"step {self.step} ({self.op}): {self.bucket} {what} [{tag}]"


@dataclass(frozen=True, slots=True)
class DiffResult:
    """Per-step buckets of both targets and their differences."""

    name: str
    steps: int
    kvspec: tuple[dict[str, int], ...]
    sglang: tuple[dict[str, int], ...]
    differences: tuple[Difference, ...]

    @property
    def unexpected(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.gap is None)

    @property
    def ok(self) -> bool:
        return not self.unexpected


def lockstep_spec(spec: Spec) -> Spec:
    """``spec`` with kvspec's engine set to the granularity the glue follows."""
    engine = spec.engine.model_copy(
        update=dict(enable_overlap=False, enable_mixed_chunk=False, chunked_prefill_size=None)
    )
    return spec.model_copy(update={"engine": engine})


class _Batches:
    """Observer: the batch kvspec's scheduler formed this iteration, as a lockstep plan."""

    def __init__(self) -> None:
        self.plan: dict[str, Any] = {"mode": "idle", "rids": []}

    def on_event(self, event: str, engine: Any) -> None:
        if event == "schedule":
            batch = engine.scheduler.cur_batch
            self.plan = {"mode": batch.mode.value, "rids": [r.rid for r in batch.reqs]}


class _Lockstep:
    """kvspec's Engine and the driver, stepped together; the rows and differences so far."""

    def __init__(self, trace: Trace, driver: LineDriver) -> None:
        self.trace, self.batches = trace, _Batches()
        self.clock = SimClock()
        self.engine = Engine(
            trace.engine.engine_config(trace.seed), clock=self.clock, observers=[self.batches]
        )
        self.sglang = Stepper(driver, trace.seed, draws_outputs=True)
        self.config = {
            "page_size": trace.engine.page_size,
            "sliding_window": trace.engine.sliding_window,
            "sessions": any(isinstance(op, OpenSession) for op in trace.ops),
        }
        self.ours: list[dict[str, int]] = []
        self.theirs: list[dict[str, int]] = []
        self.found: list[Difference] = []
        self.label = "config"

    def apply(self, op: Op) -> None:
        self.label = op_label(op)
        if isinstance(op, Step):
            for _ in range(op.n):
                self.step()
        elif isinstance(op, WaitFor):
            for _ in range(op.max_steps):
                if all(r not in self.engine.requests or r in self.engine.results for r in op.rids):
                    break
                self.step()
        elif isinstance(op, Idle):
            self.drain(op.max_steps)
        else:
            self._both(op)

    def _both(self, op: Op) -> None:
        """A non-stepping op on kvspec (as invariants/scenarios/trace_run.py does) and on the
        driver."""
        engine = self.engine
        if isinstance(op, Submit):
            if op.rid not in engine.requests:
                session = op.session.params() if op.session else None
                engine.submit(
                    op.input_ids,
                    op.sampling_params(),
                    rid=op.rid,
                    session_params=session,
                    return_logprob=op.return_logprob,
                    logprob_start_len=op.logprob_start_len,
                )
        elif isinstance(op, OpenSession):
            with contextlib.suppress(SessionError):
                engine.open_session(1000, op.sid, op.streaming, op.timeout)
        elif isinstance(op, CloseSession):
            engine.close_session(op.sid)
        elif isinstance(op, AdvanceClock):
            self.clock.t += op.seconds
        elif isinstance(op, Abort):
            self._abort(op)
            return
        self.sglang.apply(op)

    def _abort(self, op: Abort) -> None:
        rid = op.rid
        if rid is None:
            picks = _unfinished(self.engine, op.phase)
            rid = picks[op.pick % len(picks)] if picks else None
        if rid is not None:
            self.engine.abort(rid)
            self.sglang.apply(Abort(rid=rid))

    def step(self) -> None:
        self.batches.plan = {"mode": "idle", "rids": []}
        self.engine.step()
        ours = _buckets(self.engine.state_view("step", POOL_PARTS))
        theirs = _buckets(to_state_view(self.sglang.step(self.batches.plan)["views"][0]))
        self.ours.append(ours)
        self.theirs.append(theirs)
        for bucket in ours.keys() | theirs.keys():
            a, b = ours.get(bucket, -1), theirs.get(bucket, -1)
            if a != b:
                pool, _, name = bucket.rpartition(".")
                gap = declared(
                    _pool(ours, bucket), _pool(theirs, bucket), name, self.config, pool or "full"
                )
                gap_id = gap.id if gap else None
                self.found.append(Difference(len(self.ours), self.label, bucket, a, b, gap_id))

    def drain(self, max_steps: int = DRAIN_STEPS) -> None:
        """Step to kvspec's idle, and once more for a deferred close or for the iteration in
        which SGLang retires a request rejected since the last step; SGLang must be idle too."""
        for _ in range(max_steps):
            if self.engine.is_idle():
                break
            self.step()
        if (
            any(s.close_on_finish for s in self.engine.sessions.sessions.values())
            or self.sglang.idle() is None
        ):
            self.step()
        if self.sglang.idle() is None:
            self.schedule_difference("kvspec is idle, sglang is not")

    def schedule_difference(self, detail: str) -> None:
        self.found.append(
            Difference(len(self.ours) + 1, self.label, "schedule", -1, -1, None, detail)
        )


def _unfinished(engine: Engine, phase: str) -> list[str]:
    sched = engine.scheduler
    reqs: list[Any] = {
        "waiting": list(sched.waiting_queue),
        "running": list(sched.running_batch.reqs),
        "chunked": [sched.chunked_req] if sched.chunked_req is not None else [],
        "any": list(engine.requests.values()),
    }[phase]
    return [r.rid for r in reqs if not r.finished()]


def _buckets(view: StateView) -> dict[str, int]:
    """Every pool's buckets, flat: ``free`` … for the full pool, ``swa.free`` … for SWA."""
    flat: dict[str, int] = {}
    for pool in view.pools:
        prefix = "" if pool.name == "full" else f"{pool.name}."
        flat.update({prefix + k: v for k, v in pool_buckets(pool).items()})
    return flat


def _pool(row: dict[str, int], bucket: str) -> dict[str, int]:
    """The buckets of the pool ``bucket`` belongs to, by plain name."""
    prefix = bucket.rpartition(".")[0]
    return {b: row.get(f"{prefix}.{b}" if prefix else b, -1) for b in POOL_BUCKETS}


def differential(
    spec: Spec,
    python: str | None = None,
    *,
    fault: dict[str, Any] | None = None,
    driver: LineDriver | None = None,
) -> DiffResult:
    """The spec's trace on both targets in lockstep (``fault``: patched into SGLang's
    allocator, to show an undeclared difference is caught; ``driver``: reuse one)."""
    missing = unsupported_engine(spec.engine)  # first: lockstep_spec of EAGLE v2 is refused
    trace = None if missing else build_trace(lockstep_spec(spec))
    if trace is not None:
        missing = unsupported(trace)
    if missing or trace is None:
        raise ValueError(f"{spec.name}: not supported by the sglang target: {'; '.join(missing)}")
    with contextlib.ExitStack() as stack:
        live = driver or stack.enter_context(open_driver(TargetOptions(python=python)))
        live.ask(config(trace, fault))
        run = _Lockstep(trace, live)
        try:
            for op in trace.ops:
                run.apply(op)
            run.label = "drain"
            run.drain()
        except DriverError as exc:
            run.schedule_difference(str(exc))
    return DiffResult(
        spec.name, len(run.ours), tuple(run.ours), tuple(run.theirs), tuple(run.found)
    )
