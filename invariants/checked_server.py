"""The checked server: `kvspec serve`'s app — an engine on wall time with the shipped catalog
attached, and the monitor (``CheckerMonitor``) behind ``/health``, ``/invariants`` and
``/metrics``.

Keeps: the checker runs at level 1 (record) inside the engine whatever ``--strict-mem-check``
says, so a violation never breaks a step half-way; at level 2 the monitor then stops
admitting work and ``/health`` answers 503 with the first violation (docs/design.md decision 3);
at level 1 violations are only reported (``/invariants``, ``/metrics``); at 0 no checker
is attached. Session timeouts run on wall time.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from engine.server.args import ServerArgs
from invariants.checking.checker import Checker, CheckerHook, Level, summarize

if TYPE_CHECKING:
    from fastapi import FastAPI

    from engine.server.monitor import Metric

MAX_REPORTED = 200  # violations listed in full by /invariants (all are counted)


class CheckerMonitor:
    """The server's monitor over a Checker (engine/server/monitor.py ``Monitor``)."""

    def __init__(self, checker: Checker, level: int) -> None:
        self.checker = checker
        self.level = level

    def report(self) -> dict[str, Any]:
        violations = self.checker.violations
        stats = self.checker.stats()
        return {
            "level": self.level,
            "num_violations": len(violations) + self.checker.dropped,
            "by_invariant": dict(summarize(violations)),
            "violations": [asdict(v) for v in violations[:MAX_REPORTED]],
            "evaluations": sum(s.evaluations for s in stats.values()),
            "num_invariants": len(stats),
        }

    def health(self) -> tuple[bool, str]:
        if self.stop_admitting():
            return False, f"invariant violated: {self.checker.violations[0]}"
        return True, ""

    def stop_admitting(self) -> bool:
        return self.level >= Level.STRICT and bool(self.checker.violations)

    def metrics(self) -> list[Metric]:
        from engine.server.monitor import Metric

        counts = summarize(self.checker.violations)
        evaluations = sum(s.evaluations for s in self.checker.stats().values())
        total = len(self.checker.violations) + self.checker.dropped
        return [
            Metric(
                "kvspec_violations",
                "Invariant violations recorded",
                "counter",
                (({}, float(total)),),
            ),
            Metric(
                "kvspec_invariant_violations",
                "Invariant violations recorded, per invariant",
                "counter",
                tuple(({"invariant": rid}, float(n)) for rid, n in sorted(counts.items())),
            ),
            Metric(
                "kvspec_checker_evaluations",
                "Invariant evaluations",
                "counter",
                (({}, float(evaluations)),),
            ),
            Metric(
                "kvspec_strict_level",
                "--strict-mem-check level",
                "gauge",
                (({}, float(self.level)),),
            ),
        ]


def serve_app(args: ServerArgs) -> FastAPI:
    """The app `kvspec serve` runs: an engine on wall time, the shipped catalog checked at
    every event (levels 1 and 2), the monitor behind /health, /invariants and /metrics."""
    from engine.engine import Engine
    from engine.hooks import WallClock
    from engine.server.app import build_app
    from engine.server.monitor import NullMonitor
    from invariants.checking.loader import shipped_catalog

    engine = Engine(args.engine_config(), clock=WallClock())
    if engine.strict_level == 0:
        application = build_app(engine, NullMonitor(), args)
        application.state.num_invariants = 0
        return application
    catalog = shipped_catalog()
    checker = Checker(catalog, Level.RECORD)
    engine.attach(CheckerHook(checker))
    application = build_app(engine, CheckerMonitor(checker, engine.strict_level), args)
    application.state.num_invariants = len(catalog)
    return application
