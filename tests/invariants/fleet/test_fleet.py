"""The fleet's contract (invariants/fleet/workers.py): every submitted task comes back once; a
worker that dies is restarted and the task it held retried once, then handed back as an
infrastructure error while the other tasks finish; a task that raises is re-raised with the
worker's traceback. The same on spawned processes and on Ray actors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from invariants.fleet import Fleet, InProcess, Spawned, Task, TaskFailed
from invariants.fleet.ray_actors import RayActors


def square(n: int) -> int:
    return n * n


def die_once(marker: str) -> str:
    """Kills its worker the first time (``marker`` not there yet), then answers."""
    if not Path(marker).exists():
        Path(marker).touch()
        os._exit(9)
    return "survived"


def die_always(_: object) -> None:
    os._exit(9)


def raises(_: object) -> None:
    raise KeyError("planted")


def finish(fleet: Fleet, tasks: list[Task]) -> dict:
    for task in tasks:
        fleet.submit(task)
    done = {}
    while fleet.in_flight:
        d = fleet.next_done()
        assert d.task.key not in done, "a task came back twice"
        done[d.task.key] = d
    return done


def squares(n: int) -> list[Task]:
    return [Task(("sq", i), square, i) for i in range(n)]


def test_in_process_runs_in_order() -> None:
    """This process: submission order, every result."""
    fleet = InProcess()
    done = finish(fleet, squares(5))
    assert [d.result for d in done.values()] == [0, 1, 4, 9, 16]


@pytest.fixture(params=["spawned", "ray"])
def fleet(request: pytest.FixtureRequest):
    if request.param == "ray":
        ray = pytest.importorskip("ray", reason="Ray is optional: pip install 'kvspec[ray]'")
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors can't import tests
        made: Fleet = RayActors("local", 2)
    else:
        made = Spawned(2)
    yield made
    made.close()
    if request.param == "ray":
        ray.shutdown()


def test_every_task_comes_back_once(fleet: Fleet) -> None:
    done = finish(fleet, squares(9))
    assert {k: d.result for k, d in done.items()} == {("sq", i): i * i for i in range(9)}


def test_a_dead_worker_is_replaced_and_its_task_retried(fleet: Fleet, tmp_path: Path) -> None:
    """The worker dies on the task's first try: a fresh one runs it again; nothing is lost."""
    tasks = [Task(("die", 0), die_once, str(tmp_path / "died")), *squares(4)]
    done = finish(fleet, tasks)
    assert done[("die", 0)].result == "survived" and done[("die", 0)].infra is None
    assert [done[("sq", i)].result for i in range(4)] == [0, 1, 4, 9]
    assert (tmp_path / "died").exists()


def test_a_task_that_kills_every_worker_is_an_infra_error(fleet: Fleet) -> None:
    """Retried once, then handed back as infra (never a result); the fleet keeps working."""
    done = finish(fleet, [Task(("die", 1), die_always, None), *squares(3)])
    assert done[("die", 1)].result is None
    assert "died 2 times" in str(done[("die", 1)].infra)
    assert finish(fleet, squares(2))[("sq", 1)].result == 1


def test_a_task_that_raises_is_reraised(fleet: Fleet) -> None:
    """A Python exception is kvspec's bug, not a worker's death: re-raised here, named."""
    with pytest.raises(TaskFailed, match="planted"):
        finish(fleet, [Task(("raise", 0), raises, None)])


class FakeDriver:
    """What driver_for needs of a driver: a live process, and close()."""

    def __init__(self, options: object, closed: list) -> None:
        self.options, self.closed = options, closed
        self.proc = type("Proc", (), {"poll": staticmethod(lambda: None)})()

    def close(self) -> None:
        self.closed.append(self.options)


def test_a_worker_keeps_two_drivers_not_one_per_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """A campaign over many releases: each worker keeps the two drivers it used last (a target
    and its shrink twin), closing the oldest, so it never holds one engine per release."""
    from invariants.targets import explore as real
    from invariants.targets.registry import TargetOptions

    closed: list = []
    adapter = type("Adapter", (), {"open_driver": staticmethod(lambda o: FakeDriver(o, closed))})
    entry = type("Entry", (), {"adapter": staticmethod(lambda: adapter)})
    monkeypatch.setattr(real, "registered", lambda name: entry)
    monkeypatch.setattr(real, "_DRIVERS", {})
    releases = [TargetOptions(version=v) for v in ("a", "b", "c")]
    first = real.driver_for("t", releases[0])
    real.driver_for("t", releases[1])
    assert real.driver_for("t", releases[0]) is first and closed == []  # reused, most recent
    real.driver_for("t", releases[2])
    assert closed == [releases[1]] and len(real._DRIVERS) == 2
