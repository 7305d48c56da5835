"""The engine's branches a run reached, measured with coverage.py: the arcs of the engine's
decision code (scheduler, caches, memory, speculative decoding, sessions, the facade) — not
its observation wing or the models, whose branches say nothing about the state reached.

Keeps: a meter measures one run in its own process — its ops up to the drain: the drain
re-walks the decode loop the ops already reached and costs most of a run under the tracer —
records arcs only (no file is written), and names each arc ``module:from>to`` so arcs from
different worker processes and checkouts compare equal.
"""

from __future__ import annotations

from pathlib import Path

import coverage

ENGINE = Path(__file__).resolve().parents[2] / "engine"
DECISIONS = (
    "sched/*",
    "cache/*",
    "mem/*",
    "speculative/*",
    "memory.py",
    "engine.py",
    "session_api.py",
)


class BranchMeter:
    """coverage.py around part of a run: ``start``, ``stop`` (idempotent), then ``arcs``."""

    def __init__(self) -> None:
        include = [str(ENGINE / p) for p in DECISIONS]
        self.cov = coverage.Coverage(branch=True, data_file=None, include=include)
        self.running = False

    def start(self) -> None:
        self.cov.start()
        self.running = True

    def stop(self) -> None:
        if self.running:
            self.cov.stop()
            self.running = False

    def arcs(self) -> frozenset[str]:
        self.stop()
        data = self.cov.get_data()
        found: set[str] = set()
        for path in data.measured_files():
            name = Path(path).relative_to(ENGINE).as_posix()
            found.update(f"{name}:{a}>{b}" for a, b in data.arcs(path) or ())
        return frozenset(found)


__all__ = ["BranchMeter"]
