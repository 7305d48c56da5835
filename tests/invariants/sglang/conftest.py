"""The sglang target's tests run only where the sglang venv exists (`make sglang-env`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from invariants.checking.loader import load_catalog
from invariants.sglang.target import SGLangDriver, sglang_python, unavailable_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Real-SGLang tests run only when selected (`-m sglang`, as `make test-sglang` does) and
    the interpreter exists; the PR tier (`make test`) never needs sglang."""
    reason = unavailable_reason(sglang_python())
    if reason is None and "sglang" in (config.getoption("-m") or ""):
        return
    reason = reason or "real-SGLang test: run `make test-sglang` (pytest -m sglang)"
    skip = pytest.mark.skip(reason=f"sglang target: {reason}")
    for item in items:
        if item.get_closest_marker("sglang") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def catalog():
    return load_catalog()


@pytest.fixture(scope="session")
def driver() -> Iterator[SGLangDriver]:
    """One driver process for the whole session (its start, SGLang's imports, is most of a
    run's time); every run sends its own config op, which builds a fresh stack."""
    with SGLangDriver() as live:
        yield live
