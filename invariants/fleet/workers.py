"""Where exploration's work runs: in this process, on spawned local worker processes, or on Ray
actors. Every worker is long-lived — a real engine's driver, the catalog and the engine are
loaded once per worker, not per seed — and holds one task at a time, so a worker that dies is
known by the task it held: the worker is restarted, the task retried once, then handed back as
an infrastructure error (``Done.infra``), never a finding and never dropped.

Keeps: a task is (key, module-level function, argument), picklable by name as spawn and Ray
need; each submitted task comes back from ``next_done`` exactly once, in finishing order; an
exception raised by a task's function is a bug of kvspec, not of a worker, and is re-raised
here (``TaskFailed``, with the worker's traceback).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from types import ModuleType, TracebackType
from typing import Any

RETRIES = 1  # a task whose worker died is run again this many times before it is infra


@dataclass(frozen=True, slots=True)
class Task:
    """One unit of work: ``fn(arg)`` on some worker; ``key`` names it to the caller."""

    key: tuple[str, Any]  # (what kind of work, which one)
    fn: Callable[[Any], Any]
    arg: Any


@dataclass(frozen=True, slots=True)
class Done:
    """A finished task: its result, or ``infra`` (why no worker could finish it)."""

    task: Task
    result: Any = None
    infra: str | None = None


class TaskFailed(RuntimeError):
    """A task's function raised (the message: the worker's traceback)."""


class FleetError(RuntimeError):
    """A fleet cannot run (Ray not installed, the cluster unreachable)."""


class Fleet(ABC):
    """Workers that run submitted tasks (see the module docstring)."""

    size: int
    where: str

    def __init__(self) -> None:
        self.queue: deque[Task] = deque()
        self.deaths: Counter[tuple[str, Any]] = Counter()
        self.running = 0

    @property
    def in_flight(self) -> int:
        """Tasks submitted and not yet handed back."""
        return len(self.queue) + self.running

    def submit(self, task: Task) -> None:
        self.queue.append(task)
        self.dispatch()

    def died(self, task: Task, why: str) -> Done | None:
        """The worker holding ``task`` died: queue it again (first time), or its infra error."""
        self.deaths[task.key] += 1
        if self.deaths[task.key] <= RETRIES:
            self.queue.appendleft(task)
            return None
        return Done(task, infra=f"its worker died {self.deaths[task.key]} times ({why})")

    @abstractmethod
    def dispatch(self) -> None:
        """Hand queued tasks to idle workers."""

    @abstractmethod
    def next_done(self) -> Done:
        """The next finished task (blocks); only while ``in_flight``."""

    def close(self) -> None:  # noqa: B027 - a fleet without processes has nothing to stop
        """Stop the workers."""

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None):
        self.close()


class InProcess(Fleet):
    """This process, one task at a time, in submission order (what tests and the default
    deterministic run use: monkeypatches in this process stay visible)."""

    size, where = 1, "this process"

    def dispatch(self) -> None:
        pass

    def next_done(self) -> Done:
        task = self.queue.popleft()
        return Done(task, task.fn(task.arg))


def serve(conn: Connection) -> None:
    """A spawned worker's loop: run each task it is sent until it is sent None."""
    while (task := conn.recv()) is not None:
        try:
            reply = ("ok", task.fn(task.arg))
        except BaseException:
            reply = ("raised", traceback.format_exc())
        conn.send(reply)


def one_thread_each() -> None:
    """A worker per CPU: the math libraries' thread pools sized to one, as Ray sizes an
    actor of one CPU (else N workers × N threads fight over N cores: explore's default
    campaign on 2 workers took 95 s, 76 s with one thread each)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


@dataclass(slots=True, eq=False)
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    task: Task | None = None


class Spawned(Fleet):
    """``size`` spawned worker processes (never forked: the parent may hold threads)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size, self.where = size, f"{size} local worker processes"
        self.context = multiprocessing.get_context("spawn")
        self.workers = [self._start() for _ in range(size)]

    def _start(self) -> _Worker:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=serve, args=(child,), daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent)

    def dispatch(self) -> None:
        for worker in self.workers:
            if worker.task is None and self.queue:
                worker.task = self.queue.popleft()
                worker.conn.send(worker.task)
                self.running += 1

    def next_done(self) -> Done:
        while True:
            busy = [w for w in self.workers if w.task is not None]
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])[0]
            worker = next(w for w in busy if ready in (w.conn, w.process.sentinel))
            done = self._collect(worker)
            self.dispatch()
            if done is not None:
                return done

    def _collect(self, worker: _Worker) -> Done | None:
        task, worker.task = worker.task, None
        assert task is not None
        self.running -= 1
        try:
            status, value = worker.conn.recv() if worker.conn.poll() else ("died", None)
        except (EOFError, OSError):
            status, value = "died", None
        if status == "ok":
            return Done(task, value)
        if status == "raised":
            raise TaskFailed(f"task {task.key!r} raised in its worker:\n{value}")
        worker.process.join(timeout=5)
        why = f"exit code {worker.process.exitcode}"
        self.workers[self.workers.index(worker)] = self._start()
        return self.died(task, why)

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.is_alive():
                try:
                    worker.conn.send(None)
                except OSError:
                    pass
        for worker in self.workers:
            worker.process.join(timeout=5)
            if worker.process.is_alive():
                worker.process.kill()


def import_ray() -> ModuleType:
    """The ray module, or a clear error naming the extra that provides it."""
    try:
        import ray
    except ImportError:
        raise FleetError(
            "--ray-address needs Ray, which is not installed: pip install 'kvspec[ray]'"
        ) from None
    return ray
