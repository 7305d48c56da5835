"""The engine's seams to the outside: step-hook observers and the injected clock.

Keeps: the hook protocol (docs/design.md §2) — observers see ``on_event(event, engine)`` for
the events ``schedule`` (batch formed, before forward), ``forward`` (after the model wrote KV),
``process`` (results applied, requests released), ``step`` (end of every loop iteration),
``idle`` (fully idle), ``session`` (open/close/abort/flush), ``response`` (a request's
result); with no observer the engine calls a null object (no ``if`` at the call
sites, nothing built). The engine never imports the harness: a checker attaches as an
observer. Time in the engine loop comes only from the injected clock (simulated: one tick per
loop iteration), so runs replay exactly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

ENGINE_EVENTS: tuple[str, ...] = (
    "schedule",
    "forward",
    "process",
    "step",
    "idle",
    "session",
    "response",
)


class Observer(Protocol):
    """Anything that wants to see the engine at its events (the checker hook, a recorder)."""

    def on_event(self, event: str, engine: Any) -> None: ...


class HookList:
    """Calls every observer, in attach order."""

    __slots__ = ("observers",)

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers: tuple[Observer, ...] = tuple(observers)

    def on_event(self, event: str, engine: Any) -> None:
        for observer in self.observers:
            observer.on_event(event, engine)


class NullHooks:
    """The hook list when nothing observes: one empty call per event."""

    __slots__ = ()
    observers: tuple[Observer, ...] = ()

    def on_event(self, event: str, engine: Any) -> None:
        return None


def make_hooks(observers: Sequence[Observer]) -> HookList | NullHooks:
    return HookList(observers) if observers else NullHooks()


class Clock(Protocol):
    """The engine's only source of time."""

    def now(self) -> float: ...

    def tick(self) -> None: ...


@dataclass(slots=True)
class SimClock:
    """Simulated time: advances ``step_s`` seconds per loop iteration."""

    step_s: float = 0.001
    t: float = 0.0

    def now(self) -> float:
        return self.t

    def tick(self) -> None:
        self.t += self.step_s


class WallClock:
    """Wall time (the server's clock); ``tick`` does nothing."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()

    def tick(self) -> None:
        return None
