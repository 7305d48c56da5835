"""The pytest plugin for users' own checked tests — loaded by the ``pytest11`` entry point when
kvspec is installed, or with ``pytest -p invariants.pytest_plugin``:

- ``checked_engine``: a factory fixture, ``checked_engine(config=None, *, level=2, seed=0,
  **engine_fields)`` → an Engine with the checker attached (engine fields are a spec's
  ``engine:`` keys, e.g. ``page_size=4, cache="chunk"``); at level 2 the first violation
  raises ``InvariantViolation`` inside the test. ``checked_engine.checker(engine)`` is its checker.
- ``@pytest.mark.kvspec_spec("specs/x.yaml", page_size=4)``: runs that scenario spec (engine
  fields overridden as with ``--set``) under the checker before the test body, and fails the
  test on any violation, unmet goal or crash, printing the replay command; the
  ``kvspec_outcome`` fixture hands the run's outcome to the test.

Keeps: a violation fails the test that caused it and names the invariant and the step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from invariants.checking.checker import Checker, CheckerHook, Level
from invariants.checking.loader import load_catalog
from invariants.scenarios.runner import SpecOutcome, run_spec
from invariants.scenarios.spec import EngineSpec, SpecError, load_spec

MARKER = "kvspec_spec"
_OUTCOME = pytest.StashKey[SpecOutcome]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(path, **engine_fields): run the scenario spec under the kvspec checker "
        "before the test and fail the test on any violation, unmet goal or crash",
    )


class CheckedEngines:
    """The ``checked_engine`` factory: each call builds an Engine with its own checker."""

    def __init__(self) -> None:
        self._checkers: dict[int, Checker] = {}

    def __call__(
        self,
        config: EngineConfig | None = None,
        *,
        level: int = Level.STRICT,
        seed: int = 0,
        **engine_fields: Any,
    ) -> Engine:
        if config is not None and engine_fields:
            raise TypeError("checked_engine: pass an EngineConfig or engine fields, not both")
        if config is None:
            config = EngineSpec(**engine_fields).engine_config(seed)
        checker = Checker(load_catalog(), level)
        engine = Engine(config, observers=[CheckerHook(checker)])
        self._checkers[id(engine)] = checker
        return engine

    def checker(self, engine: Engine) -> Checker:
        """The checker attached to ``engine`` (its ``violations`` at level 1)."""
        return self._checkers[id(engine)]


@pytest.fixture
def checked_engine() -> CheckedEngines:
    """Factory: ``checked_engine(page_size=4)`` → an Engine checked at level 2."""
    return CheckedEngines()


@pytest.fixture
def kvspec_outcome(request: pytest.FixtureRequest) -> SpecOutcome:
    """The outcome of the test's ``kvspec_spec`` run (stats, checks, violations)."""
    if request.node.get_closest_marker(MARKER) is None:
        pytest.fail(f"kvspec_outcome needs a @pytest.mark.{MARKER}(...) on the test", pytrace=False)
    return _marked_outcome(request.node)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Run the marked spec before the test body; a failure of it fails the test."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return
    outcome = _marked_outcome(item)
    if not outcome.ok:
        pytest.fail(_failure_text(outcome, _replay(item, marker)), pytrace=False)


def _marked_outcome(item: pytest.Item) -> SpecOutcome:
    """The marked spec's outcome, run once per test (level 1: every violation recorded)."""
    if _OUTCOME not in item.stash:
        marker = item.get_closest_marker(MARKER)
        assert marker is not None
        try:
            spec = load_spec(_spec_path(item, marker), dict(marker.kwargs))
        except SpecError as exc:
            pytest.fail(f"{MARKER}: {exc}", pytrace=False)
        item.stash[_OUTCOME] = run_spec(spec, load_catalog(), Level.RECORD)
    return item.stash[_OUTCOME]


def _spec_path(item: pytest.Item, marker: pytest.Mark) -> Path:
    if len(marker.args) != 1:
        pytest.fail(f"{MARKER} takes one spec path, got {marker.args!r}", pytrace=False)
    path = Path(marker.args[0])
    candidates = (
        [path] if path.is_absolute() else [item.config.rootpath / path, item.path.parent / path]
    )
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    pytest.fail(
        f"{MARKER}: spec {path} not found (looked in {', '.join(map(str, candidates))})",
        pytrace=False,
    )


def _replay(item: pytest.Item, marker: pytest.Mark) -> str:
    sets = "".join(f" --set {key}={value}" for key, value in marker.kwargs.items())
    return f"kvspec run {_spec_path(item, marker)}{sets}"


def _failure_text(outcome: SpecOutcome, replay: str) -> str:
    lines = [
        (
            f"kvspec spec {outcome.spec.name}: {len(outcome.violations)} violations, "
            f"{len(outcome.unmet)} unmet goals{', crashed' if outcome.error else ''}"
        )
    ]
    lines += [f"  {v}" for v in outcome.violations[:5]]
    lines += [f"  expected {goal}" for goal in outcome.unmet]
    if outcome.error:
        lines.append(f"  engine error: {outcome.error}")
    return "\n".join([*lines, f"replay: {replay}"])
