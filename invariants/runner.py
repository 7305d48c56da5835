"""Runs a scenario spec through the engine with the checker attached; returns the outcome.

Keeps: the run is a pure function of the spec (one seed drives the trace and the engine),
so a failing cell replays exactly with `kvspec run SPEC`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.engine import Engine
from engine.request import SamplingParams
from engine.sched.stats import SchedulerStats
from invariants.checker import Checker, CheckerHook, InvariantViolation, Level, Violation
from invariants.loader import Catalog
from invariants.spec import Spec
from invariants.workload import TraceRequest, TraceShape, make_trace

BYTE_VOCAB = 256  # sim model and byte tokenizer: prompts are byte tokens


@dataclass(frozen=True, slots=True)
class SpecOutcome:
    """What one spec run did and found."""

    spec: Spec
    stats: SchedulerStats
    violations: tuple[Violation, ...]
    unmet: tuple[str, ...]  # expect goals that did not happen
    checks: int
    seconds: float
    error: str | None = None  # the engine raised: a finding too, never hidden

    @property
    def ok(self) -> bool:
        return not self.violations and not self.unmet and self.error is None


def run_spec(spec: Spec, catalog: Catalog, level: int = Level.RECORD) -> SpecOutcome:
    """Run ``spec`` to idle with the checker after every event."""
    checker = Checker(catalog, level=level)
    engine = Engine(spec.engine.engine_config(spec.seed), observers=[CheckerHook(checker)])
    pending = list(reversed(_trace(spec)))
    start = time.perf_counter()
    error = None
    try:
        _drive(engine, pending, spec.workload.arrivals_per_step or len(pending))
    except InvariantViolation:
        raise  # level 2: the caller wants the first violation
    except Exception as exc:  # an engine crash is reported with the violations before it
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    stats = engine.stats
    unmet = tuple(f"{name} >= {least} (got {getattr(stats, name)})"
                  for name, least in spec.expect.items() if getattr(stats, name) < least)
    checks = sum(s.evaluations for s in checker.stats().values())
    return SpecOutcome(spec, stats, tuple(checker.violations), unmet, checks, seconds, error)


def _drive(engine: Engine, pending: list[TraceRequest], per_step: int) -> None:
    """Submit ``per_step`` requests per iteration, then run to the idle event."""
    while pending:
        for _ in range(min(per_step, len(pending))):
            request = pending.pop()
            engine.submit(request.input_ids, SamplingParams(max_new_tokens=request.max_new_tokens,
                                                            ignore_eos=True), rid=request.rid)
        engine.step()
    engine.run_until_idle()  # ends on the iteration that emits the idle event


def _trace(spec: Spec) -> list[TraceRequest]:
    w = spec.workload
    shape = TraceShape(vocab=BYTE_VOCAB, num_system_prompts=w.system_prompts,
                       system_prompt_len=w.system_prompt_len, suffix_min=w.suffix[0],
                       suffix_max=w.suffix[1], gen_min=w.gen[0], gen_max=w.gen[1])
    return make_trace(spec.seed, w.requests, shape)
