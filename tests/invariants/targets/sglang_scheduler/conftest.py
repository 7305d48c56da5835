"""The real-scheduler drivers the sglang-marked tests share, one per release and test module:
``latest`` (0.5.23), ``unfixed`` (0.5.10.post1, the older release CI builds) and ``fixed``
(0.5.11); a release without its venv skips the test, naming the command that builds it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from invariants.targets.sglang_scheduler.releases import SchedulerDriver, installed_versions


def driver_of(version: str) -> Iterator[SchedulerDriver]:
    if version not in installed_versions():
        pytest.skip(f"sglang {version}: make sglang-env SGLANG_VERSION={version}")
    with SchedulerDriver(version) as driver:
        yield driver


@pytest.fixture(scope="module")
def latest() -> Iterator[SchedulerDriver]:
    yield from driver_of("0.5.23")


@pytest.fixture(scope="module")
def unfixed() -> Iterator[SchedulerDriver]:
    yield from driver_of("0.5.10.post1")


@pytest.fixture(scope="module")
def fixed() -> Iterator[SchedulerDriver]:
    yield from driver_of("0.5.11")
