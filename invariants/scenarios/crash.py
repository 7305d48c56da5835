"""Crashes as findings: an exception raised inside an engine operation becomes the ``crash``
event, checked like any other — the catalog's ``engine.*`` rule names the exception's kind and
the census rules name the pages at that moment — so the run reports a named, shrinkable,
replayable finding instead of a bare traceback.

Keeps: the kind is read from the exception's class alone (out of memory before accounting: it
is a subclass); the view is the engine's own at that moment, and a view that cannot be built
(the state is too broken to read) still carries the crash record, so the finding is never lost.
"""

from __future__ import annotations

from dataclasses import replace

from engine.engine import Engine, SchedulerStall
from engine.errors import KVAccountingError, KVOutOfMemory
from engine.view import CrashView, StateView
from invariants.checking.checker import Checker, Level, Violation

CRASH = "crash"


class DrainStuck(RuntimeError):
    """The drain's step budget ran out before the engine was idle (a liveness failure)."""


def crash_kind(exc: BaseException) -> str:
    """accounting | out_of_memory | stall | exception."""
    if isinstance(exc, KVOutOfMemory):
        return "out_of_memory"
    if isinstance(exc, KVAccountingError):
        return "accounting"
    if isinstance(exc, SchedulerStall | DrainStuck):
        return "stall"
    return "exception"


def crash_view(exc: BaseException) -> CrashView:
    """The crash record: kind, class, message, and the pages the raiser named."""
    return CrashView(
        crash_kind(exc),
        type(exc).__name__,
        str(exc),
        getattr(exc, "pool", ""),
        tuple(getattr(exc, "pages", ())),
    )


def check_crash(checker: Checker, engine: Engine, exc: BaseException) -> tuple[Violation, ...]:
    """Check the state at the crash with the crash record in it; what fired (at any level)."""
    record = crash_view(exc)
    try:
        view = engine.state_view(CRASH, checker.view_parts(CRASH))
    except Exception:  # the state is too broken to read: the record alone still names it
        view = StateView(event=CRASH, step=engine.scheduler.stats.iterations)
    level, checker.level = checker.level, min(checker.level, Level.RECORD)
    try:  # every rule at the crash is recorded, even at level 2: the run ends here anyway
        return checker.check(CRASH, replace(view, crash=(record,)))
    finally:
        checker.level = level


__all__ = ["CRASH", "DrainStuck", "check_crash", "crash_kind", "crash_view"]
