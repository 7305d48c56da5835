"""A spec or a trace on a real engine, checked by the same catalog as kvspec's engine.

Keeps: a run is a pure function of its trace (a spec's is the one kvspec's runner executes,
``build_trace``) and of the release, so every row and finding replays; a trace the target
cannot express is refused before it runs, with the reasons, never passed (before any driver
starts, but for what only the release's driver can say: then once it has started); the
catalog ids the release's design does not promise (its adapter says which, and why) are left
out and said. Level 2 stops at the first failing view with every invariant of it evaluated —
a real engine's first failing state is worth every name the catalog has for it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

from invariants.checking.checker import Checker, Level
from invariants.checking.loader import Catalog
from invariants.scenarios.ops import Trace
from invariants.scenarios.runner import spec_catalog
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import Spec
from invariants.targets.drive import Drive, drive_trace
from invariants.targets.driver import LineDriver
from invariants.targets.outcome import (
    TargetOutcome,
    disagreements,
    unmet_goals,
    unsupported_outcome,
)
from invariants.targets.registry import Target, TargetOptions

LISTED = 3  # disagreements named in a run's notes


def run_spec(
    target: Target, spec: Spec, catalog: Catalog, level: int | None = None, **kwargs: Any
) -> TargetOutcome:
    """``spec``'s trace on ``target``, checked by the spec's invariant set (``level``: the
    target's own default when None); its ``expect`` goals judged where the target counts."""
    trace = build_trace(spec)
    missing = target.adapter().unsupported(trace, _version(kwargs))
    if missing:
        return unsupported_outcome(target.name, spec, missing)
    outcome = run_trace(target, trace, spec_catalog(spec, catalog), level, **kwargs)
    return replace(outcome, spec=spec, unmet=unmet_goals(spec, outcome.stats))


def run_trace(
    target: Target,
    trace: Trace,
    catalog: Catalog,
    level: int | None = None,
    *,
    driver: LineDriver | None = None,
    options: Any = None,
    keep_views: bool = False,
    fault: dict[str, Any] | None = None,
    observe: bool = True,
) -> TargetOutcome:
    """``trace``'s ops, then the drain, on ``driver`` (a running one: the import is paid once
    for many traces) or a new one for ``options``; ``observe`` False: unchecked (the driver
    builds no view: the benchmark's baseline). ``TargetUnavailable`` when no driver starts."""
    adapter, level = target.adapter(), target.level if level is None else level
    missing = adapter.unsupported(trace, _version({"driver": driver, "options": options}))
    if missing:
        return unsupported_outcome(target.name, None, missing)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        live = driver or stack.enter_context(adapter.open_driver(options or TargetOptions()))
        missing = adapter.unsupported(trace, live.version)  # what only its driver can say
        if missing:
            return unsupported_outcome(target.name, None, missing)
        checker = Checker(applicable(catalog, live), level=min(level, Level.RECORD))
        drive = drive_trace(
            live,
            trace,
            adapter.config(trace, fault, observe),
            checker if observe else None,
            keep_views=keep_views,
            stop_at_first=level >= Level.STRICT,
            decode=adapter.decoder(),
            draws_outputs=target.draws_outputs,
        )
        outcome = _outcome(target, trace, live, checker, drive)
    return replace(outcome, seconds=time.perf_counter() - start)


def _outcome(
    target: Target, trace: Trace, live: LineDriver, checker: Checker, drive: Drive
) -> TargetOutcome:
    """A finished drive as its outcome; its notes: the adapter's, the disagreements between
    the engine's own checkers and kvspec's (where the driver records them), the waivers."""
    outcome = TargetOutcome(
        target.name,
        live.version,
        trace,
        drive.stats,
        violations=tuple(checker.violations),
        checks=sum(s.evaluations for s in checker.stats().values()),
        error=drive.error,
        crash=drive.crash,
        findings=tuple(drive.findings),
        faults=tuple(live.faults),
        stopped_at=drive.stopped_at,
        views=tuple(drive.kept),
        setup_seconds=drive.setup_seconds,
        engine=target.engine,
    )
    split = disagreements(outcome, target.engine)[:LISTED] if target.engine_checks else ()
    notes = target.adapter().notes(trace, drive) + tuple(f"disagreement: {d}" for d in split)
    return replace(outcome, notes=_driven_by(live) + notes + _waived(trace, live))


def _driven_by(driver: LineDriver) -> tuple[str, ...]:
    """The adapter the driver picked for the installed code, where its banner names one."""
    adapter = driver.banner.get("adapter")
    return (f"adapter: {adapter}, picked by probing the release's code",) if adapter else ()


def applicable(catalog: Catalog, driver: LineDriver) -> Catalog:
    """The catalog less the ids the release's design does not promise (its adapter says why)."""
    waived = driver.not_applicable
    if not any(rule.id in waived for rule in catalog):
        return catalog
    return Catalog(tuple(r for r in catalog if r.id not in waived), catalog.paths)


def _waived(trace: Trace, driver: LineDriver) -> tuple[str, ...]:
    """The waivers a trace could meet, as notes (a ``spec.`` rule's only under speculation)."""
    return tuple(
        f"not checked on this release: {rid}: {why}"
        for rid, why in driver.not_applicable.items()
        if trace.engine.speculative is not None or not rid.startswith("spec.")
    )


def _version(kwargs: dict[str, Any]) -> str | None:
    """The release a run is for: its running driver's, else the one its options name."""
    driver = kwargs.get("driver")
    return driver.version if driver is not None else getattr(kwargs.get("options"), "version", None)
