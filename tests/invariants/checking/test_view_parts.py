"""The checker asks for the costly view parts (census, tree nodes) only at events where some
rule reads them, and a view built without them says so instead of passing silently."""

from __future__ import annotations

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.view import OPTIONAL_PARTS
from invariants.checking.checker import Checker, CheckerHook, Level
from invariants.checking.loader import load_catalog


def test_parts_follow_the_rules_that_read_them() -> None:
    """Census rules listen at step and idle (and crash): those events get the census, the
    others not; only the response event builds the uncached reference tokens."""
    checker = Checker(load_catalog(), Level.RECORD)
    assert {"census", "nodes"} <= checker.view_parts("step")
    assert "census" not in checker.view_parts("forward")
    assert "nodes" not in checker.view_parts("schedule")
    assert "reference_ids" in checker.view_parts("response")
    others = ("schedule", "forward", "process", "step", "idle", "session")
    assert not any("reference_ids" in checker.view_parts(e) for e in others)
    assert OPTIONAL_PARTS == {"census", "nodes", "reference_ids"}


def test_view_without_parts_marks_them_untaken() -> None:
    """A view built without the census or nodes carries taken=False, and the counters."""
    engine = Engine(EngineConfig(memory=MemoryConfig(max_total_tokens=256)))
    engine.submit([1, 2, 3, 4])
    engine.step()
    view = engine.state_view("forward", frozenset())
    assert not view.pools[0].census.taken and not view.tree.nodes_taken
    assert view.pools[0].capacity == 256 and view.pools[0].request_owned > 0
    assert engine.state_view("step").pools[0].census.taken


def test_strict_run_with_lazy_parts_still_checks_the_census() -> None:
    """The hook passes the parts per event; a full run at level 2 stays clean."""
    checker = Checker(load_catalog(), Level.STRICT)
    engine = Engine(
        EngineConfig(memory=MemoryConfig(max_total_tokens=512)), observers=[CheckerHook(checker)]
    )
    engine.generate([[5] * 40, [6] * 30])
    assert checker.stats()["census.no_duplicates"].evaluations > 0
