"""The server's seam to a checker: the ``Monitor`` protocol, and metric records.

Keeps: the engine package never imports the harness (docs/design.md decision 4) — ``kvspec serve``
injects a monitor that wraps the invariant checker; without one the server runs with
``NullMonitor`` (always healthy, nothing to report). Every monitor method is called on the
engine loop thread only, so a monitor may read the checker's state without locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True, slots=True)
class Metric:
    """One Prometheus metric family: its samples are (labels, value)."""

    name: str
    help: str
    kind: Literal["gauge", "counter"]
    samples: tuple[tuple[dict[str, str], float], ...]


class Monitor(Protocol):
    """What the server asks of a checker."""

    def report(self) -> dict[str, Any]:
        """The live report (JSON-ready): level, violations, per-invariant counts."""
        ...

    def health(self) -> tuple[bool, str]:
        """(healthy, why not): unhealthy once a violation stops the server (level 2)."""
        ...

    def metrics(self) -> list[Metric]:
        """Metric families for ``/metrics`` (violations, evaluations)."""
        ...

    def stop_admitting(self) -> bool:
        """Whether new work must be refused (level 2, after a violation)."""
        ...


class NullMonitor:
    """No checker attached."""

    def report(self) -> dict[str, Any]:
        return {"level": 0, "num_violations": 0, "violations": []}

    def health(self) -> tuple[bool, str]:
        return True, ""

    def metrics(self) -> list[Metric]:
        return []

    def stop_admitting(self) -> bool:
        return False
