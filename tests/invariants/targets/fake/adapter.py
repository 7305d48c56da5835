"""A target's adapter for the core tests (the registry's ``Adapter``): the fake driver beside
it, run by this interpreter (``options.python``: a wrapper that runs it otherwise)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.view import StateView
from invariants.scenarios.ops import Trace
from invariants.targets.drive import Drive
from invariants.targets.driver import LineDriver
from invariants.targets.registry import Target, TargetOptions
from invariants.targets.views import to_state_view

DRIVER = Path(__file__).resolve().parent / "driver.py"
FAKE = Target("fake", "Fake", "toy engine", "everything", __name__, "KVSPEC_FAKE_PYTHON")


def open_driver(options: TargetOptions) -> LineDriver:
    return LineDriver("fake", Path(options.python or sys.executable), DRIVER)


def unsupported(trace: Trace, version: str | None) -> list[str]:
    return (
        ["force_retract: the toy engine has none"]
        if any(op.op == "force_retract" for op in trace.ops)
        else []
    )


def config(trace: Trace, fault: dict[str, Any] | None, observe: bool = True) -> dict[str, Any]:
    return {"op": "config", **(fault or {})}


def decoder() -> Callable[[dict[str, Any]], StateView]:
    return to_state_view


def notes(trace: Trace, drive: Drive) -> tuple[str, ...]:
    return ()
