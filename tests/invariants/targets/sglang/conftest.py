"""The sglang target's fixtures: the catalog, and one driver process for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from invariants.checking.loader import load_catalog
from invariants.targets.driver import LineDriver
from invariants.targets.registry import TargetOptions
from invariants.targets.sglang.adapter import open_driver


@pytest.fixture(scope="session")
def catalog():
    return load_catalog()


@pytest.fixture(scope="session")
def driver() -> Iterator[LineDriver]:
    """One driver process for the whole session (its start, SGLang's imports, is most of a
    run's time); every run sends its own config op, which builds a fresh stack."""
    with open_driver(TargetOptions()) as live:
        yield live
