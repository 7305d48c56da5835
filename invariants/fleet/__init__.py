"""Exploration past one process (`kvspec explore --workers/--ray-address`, `kvspec campaign`):
the workers that run seeds and shrinks (workers.py: this process, spawned processes;
ray_actors.py: Ray actors), and the journal that makes a campaign survive a kill
(journal.py: append-only records, atomic files, ``--resume``).

Keeps: nothing here knows what a seed is; the explorers hand it tasks and records.
"""

from invariants.fleet.journal import Journal, JournalError, write_atomic
from invariants.fleet.ray_actors import RayActors
from invariants.fleet.workers import (
    Done,
    Fleet,
    FleetError,
    InProcess,
    Spawned,
    Task,
    TaskFailed,
    import_ray,
)


def open_fleet(workers: int = 1, ray_address: str | None = None) -> Fleet:
    """The fleet asked for: Ray actors at ``ray_address`` (``local``, ``auto``, an address;
    ``workers`` actors, or one per CPU of the cluster when 1), else ``workers`` spawned
    processes, else this process."""
    if ray_address:
        return RayActors(ray_address, workers if workers > 1 else 0)
    return Spawned(workers) if workers > 1 else InProcess()


__all__ = [
    "Done",
    "Fleet",
    "FleetError",
    "InProcess",
    "Journal",
    "JournalError",
    "Spawned",
    "Task",
    "TaskFailed",
    "import_ray",
    "open_fleet",
    "write_atomic",
]
