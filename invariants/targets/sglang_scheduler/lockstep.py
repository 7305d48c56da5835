"""kvspec's scheduler and SGLang's real one on the same trace, op by op, each iteration's
batch and pool buckets compared; the first difference no declared gap explains ends the run.

Keeps: both sides interpret the trace the way their own targets do — kvspec through its
runner's op interpreter (``scenarios/trace_run.py``), SGLang through the targets' stepper
(``targets/drive.py``) — on the same configuration (the adapter's ``config``); where an op
leaves a choice to the side (an abort by phase and pick) kvspec's choice is sent to SGLang, so
both act on the same request. The inputs are equalized where the target cannot express them or
the designs differ on purpose, and each such change is said (``notes``): token values differ
(the sim model and the fake worker draw their own), so EOS is turned off on both sides; the
target sends no logprob request, so kvspec's are plain too; the target's SGLang has no
tokenizer to strip a session turn's BOS, so the trace comes without it. Iterations pair up
within an op; a difference is declared by a scheduler gap (``gaps.py``: batch aspects
one by one, the buckets jointly) or a memory-class gap (``targets/sglang/gaps.py``, which
holds here too), else it is the divergence, printed with both sides' batch and buckets and,
where it looks like one, a known divergence's cause (``known.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.model.tokenizer import BOS_ID
from engine.view import POOL_BUCKETS
from invariants.checking.checker import Checker, Level
from invariants.checking.loader import Catalog
from invariants.scenarios.ops import Abort, Op, OpenSession, Step, Submit, Trace, WaitFor, op_label
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import Spec
from invariants.scenarios.trace_run import _Interpreter
from invariants.targets.drive import DRAIN_STEPS, Stepper
from invariants.targets.driver import DriverError, LineDriver
from invariants.targets.sglang.gaps import GAPS
from invariants.targets.sglang.gaps import declared as bucket_gap
from invariants.targets.sglang_scheduler.adapter import config, is_mla, unsupported
from invariants.targets.sglang_scheduler.gaps import (
    SCHED_GAPS,
    Ledger,
    Situation,
    pool_gaps,
    sched_gap,
)
from invariants.targets.sglang_scheduler.known import likely_causes
from invariants.targets.sglang_scheduler.lockstep_records import (
    Iteration,
    Recorder,
    compare,
    sglang_iteration,
)
from invariants.targets.sglang_scheduler.releases import SchedulerDriver

LOCKSTEP_SPECULATIVE = (
    "speculative (lockstep compares plain batches: a verify batch's draft tokens and "
    "accept lengths are not read from either side yet)"
)
LOCKSTEP_HYBRID = (
    "hybrid SWA or MLA pools (lockstep pairs the full pool's buckets only; its gaps were "
    "never read against SGLang's SWA eviction cadence or its MLA pool)"
)


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first undeclared difference: where (the op in flight and the last op before it
    that was no step), in what, and both sides' iteration (None: that side ran none)."""

    op_index: int  # len(trace.ops): the drain after the last op
    op: str
    after: str  # the last non-stepping op applied before it ("": none)
    aspects: tuple[str, ...]  # lockstep_records.ASPECTS, or "iterations"
    kvspec: Iteration | None
    sglang: Iteration | None
    likely: tuple[tuple[str, str], ...] = ()  # (id, reason) of known divergences it matches

    def lines(self) -> list[str]:
        ours = self.kvspec.describe() if self.kvspec else "no iteration"
        theirs = self.sglang.describe() if self.sglang else "no iteration"
        after = f", after {self.after}" if self.after else ""
        causes = [f"  likely cause: {gid}: {why}" for gid, why in self.likely]
        return [
            f"first divergence in op #{self.op_index} ({self.op}{after}): "
            f"{', '.join(self.aspects)} differ",
            f"  kvspec: {ours}",
            f"  sglang: {theirs}",
            *causes,
        ]


@dataclass(frozen=True, slots=True)
class GapHit:
    """A declared gap that explained differences: how often, and where first."""

    gap: str
    reason: str
    count: int
    first_op: str


@dataclass(frozen=True, slots=True)
class LockstepResult:
    """One trace in lockstep: the iterations compared and the first divergence (None: they
    agree up to ``gaps``)."""

    name: str
    version: str
    iterations: int  # iteration pairs compared (the divergent one included)
    divergence: Divergence | None
    gaps: tuple[GapHit, ...]
    notes: tuple[str, ...]
    seconds: float
    error: str | None = None
    unsupported: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.divergence is None and self.error is None and not self.unsupported


def equalized(trace: Trace) -> tuple[Trace, tuple[str, ...]]:
    """``trace`` with the inputs neither side's comparison can share made equal (see the
    module docstring), and a note for each change made."""
    notes, engine, ops = [], trace.engine, list(trace.ops)
    if engine.eos_prob > 0:
        engine = engine.model_copy(update={"eos_prob": 0.0})
        notes.append(
            f"eos_prob {trace.engine.eos_prob} -> 0 on both sides (token values differ by "
            "design: kvspec's sim model and the target's fake worker draw their own)"
        )
    logprob = sum(isinstance(op, Submit) and op.return_logprob for op in ops)
    if logprob:
        ops = [
            op.model_copy(update={"return_logprob": False})
            if isinstance(op, Submit) and op.return_logprob
            else op
            for op in ops
        ]
        notes.append(
            f"return_logprob off on {logprob} submits (the target sends no logprob "
            "request; a logprob request keeps a batch from mixing on kvspec)"
        )
    ops, stripped = _strip_session_bos(ops)
    if stripped:
        notes.append(
            f"leading BOS stripped from {stripped} session submits on both sides (the target "
            "runs SGLang without a tokenizer, so Session._strip_bos_token never strips an "
            "appended turn's BOS, which kvspec and a served SGLang do)"
        )
    return trace.model_copy(update={"engine": engine, "ops": ops}), tuple(notes)


def _strip_session_bos(ops: list[Op]) -> tuple[list[Op], int]:
    """Every session submit without its leading BOS (and how many there were)."""
    out, count = [], 0
    for op in ops:
        if isinstance(op, Submit) and op.session and op.input_ids[:1] == [BOS_ID]:
            if len(op.input_ids) > 1:
                op = op.model_copy(update={"input_ids": op.input_ids[1:]})
                count += 1
        out.append(op)
    return out, count


def lockstep_spec(spec: Spec, **kwargs: Any) -> LockstepResult:
    """``spec``'s trace (kvspec runner's own ``build_trace``) in lockstep."""
    return lockstep_trace(build_trace(spec), name=spec.name, **kwargs)


def lockstep_trace(
    trace: Trace,
    *,
    name: str | None = None,
    version: str | None = None,
    python: str | None = None,
    driver: LineDriver | None = None,
) -> LockstepResult:
    """``trace`` on kvspec's engine and on SGLang's real scheduler, in lockstep."""
    name = name or trace.name
    missing = tuple(unsupported(trace, version))
    if trace.engine.speculative is not None:  # a verify batch's drafts are not read yet
        missing += (LOCKSTEP_SPECULATIVE,)
    if trace.engine.swa_tokens is not None or is_mla(trace.engine):
        missing += (LOCKSTEP_HYBRID,)
    if missing:
        return LockstepResult(name, version or "", 0, None, (), (), 0.0, unsupported=missing)
    trace, notes = equalized(trace)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        live = driver or stack.enter_context(SchedulerDriver(version, python))
        run = _Lockstep(trace, live)
        divergence = run.run()
    hits = tuple(GapHit(gid, reason, len(ops), ops[0]) for gid, (reason, ops) in run.hits.items())
    seconds = time.perf_counter() - start
    return LockstepResult(
        name, live.version, run.compared, divergence, hits, notes, seconds, run.error
    )


class _EngineRaised(RuntimeError):
    """kvspec's engine raised while the lockstep drove it."""


class _Lockstep:
    """kvspec's interpreter and the target's trace, one op at a time."""

    def __init__(self, trace: Trace, driver: LineDriver) -> None:
        self.trace, self.driver = trace, driver
        self.recorder = Recorder()
        # the runner's own interpreter: the ops mean on kvspec what `kvspec run` makes them
        off = Checker(Catalog(()), level=Level.OFF)
        self.kvspec = _Interpreter(trace, off, [self.recorder])
        self.sglang = Stepper(driver, trace.seed, draws_outputs=False)
        self.config = {
            "page_size": trace.engine.page_size,
            "sliding_window": trace.engine.sliding_window,
            "sessions": any(isinstance(op, OpenSession) for op in trace.ops),
            "overlap": trace.engine.enable_overlap,
            "streaming": trace.engine.enable_streaming_session,
            "ignore_eos": any(isinstance(op, Submit) and op.ignore_eos for op in trace.ops),
            "parents": {  # a session turn's rid -> the turn it appends to
                op.rid: op.session.rid for op in trace.ops if isinstance(op, Submit) and op.session
            },
        }
        self.hits: dict[str, tuple[str, list[str]]] = {}
        self.after = ""
        self.error: str | None = None
        self.sglang_before: Iteration | None = None  # SGLang's latest iteration compared
        self.kvspec_before: Iteration | None = None  # kvspec's
        self.ledger = Ledger()
        self.compared = 0  # iteration pairs compared (the divergent one included)

    def run(self) -> Divergence | None:
        """Every op, then the drain; the first divergence (or None; an error ends it too)."""
        self.driver.ask(config(self.trace))
        try:
            ops: list[Op | None] = [*self.trace.ops, None]
            for index, op in enumerate(ops):
                found = self.op(index, op)
                if found is not None:
                    return found
                if op is not None and not isinstance(op, Step | WaitFor):
                    self.after = f"op #{index} ({op_label(op)})"
            return None
        except DriverError as exc:  # SGLang's own crash included
            self.error = f"sglang: {exc}"
        except _EngineRaised as exc:
            self.error = f"kvspec: {exc}"
        finally:
            self.driver.end()
        return None

    def op(self, index: int, op: Op | None) -> Divergence | None:
        """One op on both sides (None: the drain), then its iterations compared."""
        before = len(self.recorder.iterations)
        if op is None:
            self.engine(self.kvspec.drain)
            answers = self.sglang.drain(DRAIN_STEPS)
        else:
            current = op
            result = self.engine(lambda: self.kvspec.apply(current))
            if isinstance(op, Submit) and result.status == "rejected":
                self.ledger.rejected.add(op.rid)
            if isinstance(op, Abort) and op.rid is None and result.status == "ok":
                op = op.model_copy(update={"rid": result.detail})  # kvspec's pick
            answers = self.sglang.apply(op)
        ours = self.recorder.iterations[before:]
        theirs = [sglang_iteration(a) for a in answers if "batch" in a]
        return self.pair(index, op, ours, theirs)

    @staticmethod
    def engine(call: Callable[[], Any]) -> Any:
        """``call()`` on kvspec's engine; what the engine raises (a stall, an error of its
        own) ends the run as its error, never as a divergence."""
        try:
            return call()
        except Exception as exc:
            raise _EngineRaised(f"{type(exc).__name__}: {exc}") from exc

    def pair(
        self, index: int, op: Op | None, ours: list[Iteration], theirs: list[Iteration]
    ) -> Divergence | None:
        label = "the drain after the last op" if op is None else op_label(op)
        for i in range(max(len(ours), len(theirs))):
            a = ours[i] if i < len(ours) else None
            b = theirs[i] if i < len(theirs) else None
            aspects = compare(a, b) if a is not None and b is not None else ("iterations",)
            where = f"{label} @ kvspec iteration {a.number if a else '-'}"
            open_ = [x for x in aspects if x not in POOL_BUCKETS]
            open_ = [x for x in open_ if not self.batch_declared(x, op, a, b, where)]
            pool = [x for x in aspects if x in POOL_BUCKETS]
            if pool and not self.pool_declared(pool, self.situation(op, a, b), where):
                open_ += pool
            self.compared += 1
            if open_:
                likely = tuple((k.id, k.reason) for k in likely_causes(self.situation(op, a, b)))
                return Divergence(index, label, self.after, tuple(open_), a, b, likely)
            self.sglang_before = b or self.sglang_before
            self.kvspec_before = a or self.kvspec_before
        return None

    def situation(self, op: Op | None, a: Iteration | None, b: Iteration | None) -> Situation:
        version = self.driver.version
        return Situation(
            op, a, b, self.config, self.sglang_before, version, self.ledger, self.kvspec_before
        )

    def batch_declared(
        self, aspect: str, op: Op | None, a: Iteration | None, b: Iteration | None, where: str
    ) -> bool:
        """Whether a batch gap declares ``aspect``'s difference (counted as that gap's)."""
        situation = self.situation(op, a, b)
        gap = sched_gap(aspect, situation)
        if gap is None:
            return False
        if gap.note is not None:
            gap.note(situation)
        self.hit(gap.id, gap.reason, where)
        return True

    def pool_declared(self, buckets: list[str], situation: Situation, where: str) -> bool:
        """Whether gaps explain the buckets' difference: the scheduler's, jointly, else the
        memory classes' (invariants/targets/sglang/gaps.py), bucket by bucket."""
        a, b = situation.kvspec, situation.sglang
        assert a is not None and b is not None
        ids = pool_gaps(situation)
        if ids is not None:
            for gid in ids:
                self.hit(gid, REASONS[gid], where)
            return True
        gaps = [bucket_gap(a.buckets, b.buckets, x, self.config) for x in buckets]
        found = [gap for gap in gaps if gap is not None]
        if len(found) < len(gaps):
            return False
        for gap in found:
            self.hit(gap.id, gap.reason, where)
        return True

    def hit(self, gid: str, reason: str, where: str) -> None:
        """Count ``gid`` once per iteration it explained something in."""
        seen = self.hits.setdefault(gid, (reason, []))[1]
        if not seen or seen[-1] != where:
            seen.append(where)


REASONS: dict[str, str] = {gap.id: gap.reason for gap in SCHED_GAPS}
REASONS |= {gap.id: gap.reason for gap in GAPS}
