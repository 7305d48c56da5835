"""The fleet on a Ray cluster (``--ray-address``, the optional ``kvspec[ray]`` extra): one
long-lived actor per CPU (or ``--workers``), each a worker process that keeps what its tasks
load (the catalog, a real engine's driver) for the whole campaign.

Keeps: an actor holds one task at a time, so an actor that dies (its process killed, its node
lost) is known by the task it held: a fresh actor takes its place and the task is retried
once (``Fleet.died``); every node needs kvspec installed in the same environment.
"""

from __future__ import annotations

from typing import Any

from invariants.fleet.workers import Done, Fleet, FleetError, Task, TaskFailed, import_ray


class FleetActor:
    """A Ray actor's body: runs tasks; its process's caches outlive each task."""

    def run(self, task: Task) -> Any:
        return task.fn(task.arg)


class RayActors(Fleet):
    """Ray actors at ``address`` (``size`` 0: one per CPU of the cluster)."""

    def __init__(self, address: str, size: int = 0) -> None:
        super().__init__()
        self.ray = import_ray()
        self.started_here = not self.ray.is_initialized()
        if self.started_here:
            try:
                # "local": Ray's own word for a fresh instance, even beside a running cluster
                self.ray.init(address=address, log_to_driver=False, include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise FleetError(f"--ray-address {address}: {exc}") from None
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        self.size = size or max(1, cpus)
        nodes = len([n for n in self.ray.nodes() if n.get("Alive")])
        self.where = f"{self.size} Ray actors on {nodes} node(s) ({address})"
        self.remote = self.ray.remote(num_cpus=1, max_restarts=0)(FleetActor)
        self.idle = [self.remote.remote() for _ in range(self.size)]
        self.held: dict[Any, tuple[Any, Task]] = {}  # object ref -> (actor, task)

    def dispatch(self) -> None:
        while self.idle and self.queue:
            actor, task = self.idle.pop(), self.queue.popleft()
            self.held[actor.run.remote(task)] = (actor, task)
            self.running += 1

    def next_done(self) -> Done:
        exceptions = self.ray.exceptions
        while True:
            [ref], _ = self.ray.wait(list(self.held), num_returns=1)
            actor, task = self.held.pop(ref)
            self.running -= 1
            try:
                done: Done | None = Done(task, self.ray.get(ref))
                self.idle.append(actor)
            except exceptions.RayActorError as exc:
                self.ray.kill(actor, no_restart=True)
                self.idle.append(self.remote.remote())
                done = self.died(task, type(exc).__name__)
            except exceptions.RayTaskError as exc:
                raise TaskFailed(f"task {task.key!r} raised on its actor:\n{exc}") from None
            self.dispatch()
            if done is not None:
                return done

    def close(self) -> None:
        for actor in [*self.idle, *(a for a, _ in self.held.values())]:
            self.ray.kill(actor, no_restart=True)
        self.idle, self.held = [], {}
        if self.started_here:
            self.ray.shutdown()
