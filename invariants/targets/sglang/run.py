"""Scenario specs and op traces on the sglang target, checked by the same Checker and catalog.

Keeps: a run is a pure function of its trace (the spec's ``build_trace``, the one kvspec's
runner executes), so the sglang column of a report replays exactly; an op the driver refuses,
or a spec feature the adapter does not model, is reported as the outcome's error — never
hidden as a pass; the schedule difference a run accepts (no chunked prefill) is a note.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from invariants.checking.checker import Checker, Level, Violation
from invariants.checking.loader import Catalog
from invariants.scenarios.ops import Submit, Trace, op_label
from invariants.scenarios.runner import spec_catalog
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import Spec
from invariants.targets.sglang.target import DriverError, LineDriver, SGLangDriver
from invariants.targets.sglang.trace_driver import TraceDriver, driver_config, unsupported
from invariants.targets.sglang.views import to_state_view

if TYPE_CHECKING:
    from engine.view import StateView

MAX_STEPS = 200_000
# spec counter names (kvspec's SchedulerStats) -> the driver's counts
GOALS = {
    "finished_reqs": "finished",
    "cached_tokens": "prefix_hit_tokens",
    "evicted_tokens": "evicted_tokens",
    "aborted_reqs": "aborted",
}


@dataclass(frozen=True, slots=True)
class SGLangStats:
    """What the glue observed on real SGLang (each counter > 0 proves that path ran)."""

    steps: int = 0
    admitted: int = 0
    finished: int = 0
    aborted: int = 0
    rejected: int = 0
    prefix_hit_tokens: int = 0
    extend_tokens: int = 0
    decode_tokens: int = 0
    evicted_tokens: int = 0


@dataclass(frozen=True, slots=True)
class SGLangOutcome:
    """SpecOutcome-compatible: one spec (or op list) on real SGLang."""

    spec: Spec | None
    stats: SGLangStats
    violations: tuple[Violation, ...]
    unmet: tuple[str, ...]
    checks: int
    seconds: float
    error: str | None = None
    sglang_version: str = ""
    faults: tuple[dict[str, Any], ...] = ()  # what an injected fault did (driver report)
    views: tuple[Any, ...] = field(default=(), repr=False)  # kept only when asked
    notes: tuple[str, ...] = ()  # what the run did differently from kvspec's (said, not hidden)
    unsupported: tuple[str, ...] = ()  # why the spec did not run at all (also in ``error``)
    stopped_at: int | None = None  # the op of the first violation, when the run stopped there

    @property
    def ok(self) -> bool:
        return not self.violations and not self.unmet and self.error is None

    @property
    def iterations(self) -> int:
        return self.stats.steps

    @property
    def engine_findings(self) -> tuple[Any, ...]:
        """The engine's own checker's findings: none seen through this target."""
        return ()


def chunking_note(trace: Trace) -> list[str]:
    """The one schedule difference a run mode accepts (and says): prompts longer than the
    chunk prefill whole on the glue, which does not split a prefill."""
    chunk = trace.engine.chunked_prefill_size
    longest = max((len(op.input_ids) for op in trace.ops if isinstance(op, Submit)), default=0)
    if chunk and longest > chunk:
        return [
            f"chunked prefill not reproduced: prompts up to {longest} tokens prefill whole "
            f"(chunked_prefill_size={chunk})"
        ]
    return []


def run_spec_on_sglang(
    spec: Spec,
    catalog: Catalog,
    level: int = Level.RECORD,
    python: str | None = None,
    *,
    driver: SGLangDriver | None = None,
    keep_views: bool = False,
) -> SGLangOutcome:
    """Run ``spec``'s trace (the runner's own ``build_trace``) on real SGLang under the
    checker with the spec's invariant set (SpecOutcome-compatible result)."""
    trace = build_trace(spec)
    missing = unsupported(trace)
    if missing:
        return SGLangOutcome(
            spec,
            SGLangStats(),
            (),
            (),
            0,
            0.0,
            f"not supported by the sglang target: {'; '.join(missing)}",
            unsupported=tuple(missing),
        )
    return run_trace_on_sglang(
        trace,
        spec_catalog(spec, catalog),
        level,
        python,
        spec=spec,
        driver=driver,
        keep_views=keep_views,
    )


def run_trace_on_sglang(
    trace: Trace,
    catalog: Catalog,
    level: int = Level.RECORD,
    python: str | None = None,
    *,
    spec: Spec | None = None,
    keep_views: bool = False,
    fault: dict[str, Any] | None = None,
    driver: SGLangDriver | None = None,
) -> SGLangOutcome:
    """A trace's ops on real SGLang under the checker, then the drain to idle;
    ``SGLangUnavailable`` if there is none. ``driver``: reuse a running one (tests)."""
    missing = unsupported(trace)
    if missing:
        raise ValueError(f"{trace.name}: not supported by the sglang target: {'; '.join(missing)}")
    checker = Checker(catalog, level=level)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        live = driver if driver is not None else stack.enter_context(SGLangDriver(python))
        stats, views, error = _drive(live, trace, checker, keep_views, fault)
        version, faults = live.version, tuple(live.faults)
    seconds = time.perf_counter() - start
    checks = sum(s.evaluations for s in checker.stats().values())
    return SGLangOutcome(
        spec,
        stats,
        tuple(checker.violations),
        unmet_goals(spec, stats),
        checks,
        seconds,
        error,
        version,
        faults,
        tuple(views),
        tuple(chunking_note(trace)),
    )


def unmet_goals(spec: Spec | None, stats: Any, goals: dict[str, str] = GOALS) -> tuple[str, ...]:
    """The spec's ``expect`` goals that the run fell short of: those ``goals`` maps to a
    field of the driver's ``stats``."""
    expect = spec.expect if spec is not None else {}
    return tuple(
        f"{name} >= {least} (got {getattr(stats, goals[name])})"
        for name, least in expect.items()
        if name in goals and getattr(stats, goals[name]) < least
    )


def _drive(
    driver: SGLangDriver,
    trace: Trace,
    checker: Checker,
    keep_views: bool,
    fault: dict[str, Any] | None,
) -> tuple[SGLangStats, list[Any], str | None]:
    config = driver_config(trace.engine, trace.seed, fault)
    counts, kept, error, _ = drive_trace(driver, trace, config, checker, keep_views)
    return SGLangStats(**counts), kept, error


class Drive(NamedTuple):
    """What ``drive_trace`` did: the driver's counts, the views kept, the error (a refused
    op, named with its index), the op the first violation came in (``stop_at_first``;
    ``len(trace.ops)``: the drain; None: none)."""

    counts: dict[str, Any]
    kept: list[Any]
    error: str | None
    stopped_at: int | None = None


def drive_trace(
    driver: LineDriver,
    trace: Trace,
    config: dict[str, Any],
    checker: Checker | None,
    keep_views: bool = False,
    stop_at_first: bool = False,
    decode: Callable[[dict[str, Any]], StateView] = to_state_view,
) -> Drive:
    """The config op, every op of ``trace``, the drain to idle, each view (``decode`` makes
    it a StateView) through ``checker`` (None: unchecked; ``stop_at_first``: no op after the
    first violating view). Both real-engine targets run their traces through this."""
    kept: list[Any] = []
    run = TraceDriver(driver, trace.seed)  # type: ignore[arg-type]

    def check(raw_views: list[dict[str, Any]]) -> bool:
        """Whether to stop: a violation under ``stop_at_first``."""
        for raw in raw_views if checker is not None else ():
            view = decode(raw)
            checker.check(view.event, view)
            if keep_views:
                kept.append(view)
        return stop_at_first and checker is not None and bool(checker.violations)

    error, stopped = None, None
    try:
        if not check(driver.send(config)):
            stopped = _apply_all(run, trace, check)
    except DriverError as exc:
        error = str(exc)
    return Drive(driver.send({"op": "stats"})[0]["counts"], kept, error, stopped)


def _apply_all(
    run: TraceDriver, trace: Trace, check: Callable[[list[dict[str, Any]]], bool]
) -> int | None:
    """Each op, then the drain; the index where ``check`` said stop (None: never)."""
    for index, op in enumerate(trace.ops):
        try:
            if check(run.apply(op)):
                return index
        except DriverError as exc:
            raise DriverError(f"op #{index} ({op_label(op)}): {exc}") from None
    return len(trace.ops) if check(run.drain(MAX_STEPS)) else None
