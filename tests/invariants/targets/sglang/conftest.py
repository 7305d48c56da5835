"""The sglang target's fixtures: the catalog, and one driver process for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from invariants.checking.loader import load_catalog
from invariants.targets.sglang.target import SGLangDriver


@pytest.fixture(scope="session")
def catalog():
    return load_catalog()


@pytest.fixture(scope="session")
def driver() -> Iterator[SGLangDriver]:
    """One driver process for the whole session (its start, SGLang's imports, is most of a
    run's time); every run sends its own config op, which builds a fresh stack."""
    with SGLangDriver() as live:
        yield live
