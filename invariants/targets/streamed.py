"""A real engine's exploration on a fleet, journaled as it goes (``explore_real``,
``resume_real``): seeds handed to workers (each keeps its driver: the engine is imported once
per worker), each result recorded the moment it arrives, the first failing seed of each
failure key written at once and shrunk once, on a worker.

Keeps: results are considered in seed order (a result waits for every earlier seed's), so the
findings and the printed report are the same for any number of workers and after any resume;
a seed whose worker died twice is an infrastructure error, never a finding.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from invariants.explore.explorer import Finding
from invariants.fleet import Done, Fleet, Journal, Task, open_fleet, write_atomic
from invariants.targets.explore import (
    DEFAULT_SEEDS,
    DEFAULT_STEPS,
    SHRINK_BUDGET,
    ExploreReport,
    RealTarget,
    SeedRun,
    driver_for,
    seed_task,
    shrink_task,
)
from invariants.targets.registry import TargetOptions

REPORT_EVERY_S = 2.0


def explore_real(
    target: RealTarget,
    seeds: int = DEFAULT_SEEDS,
    steps: int = DEFAULT_STEPS,
    *,
    seed_start: int = 0,
    workers: int = 1,
    fail_fast: bool = False,
    out_dir: Path = Path("explore-failures"),
    max_shrunk: int = 3,
    shrink_budget: int = SHRINK_BUDGET,
    ray_address: str | None = None,
) -> ExploreReport:
    """Seeds ``seed_start …`` on ``target`` (``workers`` processes, or Ray actors at
    ``ray_address``), journaled in ``out_dir``; each distinct failure key's first seed shrunk
    there (at most ``max_shrunk``); ``TargetUnavailable`` before any seed runs when no driver
    starts."""
    header = real_header(target, seeds, steps, seed_start, fail_fast, max_shrunk, shrink_budget)
    return _journaled(Journal.start(out_dir, header), workers, ray_address)


def real_header(
    target: RealTarget,
    seeds: int = DEFAULT_SEEDS,
    steps: int = DEFAULT_STEPS,
    seed_start: int = 0,
    fail_fast: bool = False,
    max_shrunk: int = 3,
    shrink_budget: int = SHRINK_BUDGET,
) -> dict[str, object]:
    """What the journal says the exploration is (all a resume needs)."""
    return {
        "kind": "explore-real",
        "target": target.name,
        "python": target.options.python,
        "version": target.options.version,
        "seeds": seeds,
        "steps": steps,
        "seed_start": seed_start,
        "fail_fast": fail_fast,
        "max_shrunk": max_shrunk,
        "shrink_budget": shrink_budget,
    }


def resume_real(out_dir: Path, workers: int = 1, ray_address: str | None = None) -> ExploreReport:
    """Continue the exploration journaled in ``out_dir``: its finished seeds are read back."""
    return _journaled(Journal.resume(out_dir, "explore-real"), workers, ray_address)


def _journaled(journal: Journal, workers: int, ray_address: str | None) -> ExploreReport:
    stream = SeedStream(journal)  # its driver starts here: TargetUnavailable before any seed
    with open_fleet(workers, ray_address) as fleet:
        return stream.run(fleet)


class SeedStream:
    """One journaled exploration of a real engine (see the module docstring)."""

    def __init__(self, journal: Journal) -> None:
        h = journal.header
        self.journal, self.out, self.h = journal, journal.path.parent, h
        self.target = RealTarget(h["target"], TargetOptions(h["python"], h["version"]))
        self.seeds = range(h["seed_start"], h["seed_start"] + h["seeds"])
        self.done: dict[int, SeedRun | None] = {
            r["seed"]: SeedRun(**r) for r in journal.of("seed")
        } | {i["seed"]: None for i in journal.of("infra")}
        findings = [Finding.from_record(f) for f in journal.of("finding")]
        self.keys = {f.key for f in findings}
        self.shrinking: dict[str, SeedRun] = {}
        self.considered, self.stopping, self.written = self.seeds.start, False, 0.0
        self.start = time.perf_counter()
        version = driver_for(self.target.name, self.target.options).version
        self.report = ExploreReport(self.target.name, version, findings=findings)
        self.report.infra = [i["why"] for i in journal.of("infra")]

    def run(self, fleet: Fleet) -> ExploreReport:
        self.report.where = fleet.where
        pending = [s for s in reversed(self.seeds) if s not in self.done]
        self._consider(fleet)
        while True:  # 2 × the fleet's size kept running, so a fail-fast stops soon
            while pending and not self.stopping and fleet.in_flight < 2 * fleet.size:
                task_arg = (pending.pop(), self.h["steps"], self.target)
                fleet.submit(Task(("seed", task_arg[0]), seed_task, task_arg))
            if not fleet.in_flight:
                break
            self._handle(fleet.next_done(), fleet)
        self.report.results.sort(key=lambda r: r.seed)
        self.report.findings.sort(key=lambda f: f.seed)
        self._write_report(final=True)
        return self.report

    def _handle(self, done: Done, fleet: Fleet) -> None:
        kind, name = done.task.key
        if kind == "shrink":
            self._shrunk(self.shrinking.pop(name), done)
            return
        if done.infra is not None:
            why = f"seed {name}: {done.infra}"
            self.journal.append({"infra": {"seed": name, "why": why}})
            self.report.infra.append(why)
            self.done[name] = None
        else:
            self.journal.append({"seed": asdict(done.result)})
            self.done[name] = done.result
        self._consider(fleet)

    def _consider(self, fleet: Fleet) -> None:
        """Take the results whose earlier seeds are all in, in seed order."""
        while not self.stopping and self.considered in self.done:
            result = self.done[self.considered]
            self.considered += 1
            if result is not None:
                self._take(result, fleet)
        self._write_report()

    def _take(self, result: SeedRun, fleet: Fleet) -> None:
        self.report.results.append(result)
        if result.key in (None, "config"):  # clean, or a configuration the engine refuses
            return
        if self.report.first_failure_s is None:
            self.report.first_failure_s = time.perf_counter() - self.start
        self.stopping |= bool(self.h["fail_fast"])
        key = str(result.key)
        if key not in self.keys and len(self.keys) < self.h["max_shrunk"]:
            self.keys.add(key)
            self.shrinking[key] = result
            write_atomic(self._path(result), self.target.trace(result.seed, self.h["steps"]).text())
            arg = (self.target, result.seed, key, self.h["steps"], self.h["shrink_budget"])
            fleet.submit(Task(("shrink", key), shrink_task, arg))

    def _shrunk(self, result: SeedRun, done: Done) -> None:
        if done.infra is not None:  # the unshrunk trace stays written
            self.report.infra.append(f"shrink of seed {result.seed}: {done.infra}")
            return
        small, runs, before = done.result
        name = f"{self.target.name}-seed-{result.seed}-shrunk"
        path = write_atomic(self._path(result), small.model_copy(update={"name": name}).text())
        finding = Finding(
            result.seed, str(result.key), result.detail, path, before, len(small.ops), runs
        )
        self.journal.append({"finding": finding.record()})
        self.report.findings.append(finding)

    def _path(self, result: SeedRun) -> Path:
        return self.out / f"{self.target.name}-seed-{result.seed}.json"

    def _write_report(self, final: bool = False) -> None:
        now = time.perf_counter()
        if final or now - self.written >= REPORT_EVERY_S:
            self.written, self.report.seconds = now, now - self.start
            text = json.dumps(report_json(self.report, self.h["steps"]), indent=2) + "\n"
            write_atomic(self.out / "report.json", text)


def report_json(report: ExploreReport, steps: int) -> dict[str, object]:
    """A real engine's exploration as JSON: every seed, the findings, the infra errors."""
    return {
        "target": report.target,
        "version": report.version,
        "seeds": len(report.results),
        "steps": steps,
        "seconds": round(report.seconds, 2),
        "where": report.where,
        "failing": [
            {"seed": r.seed, "label": r.label, "failure": r.key, "detail": r.detail}
            for r in report.failed
        ],
        "findings": [
            {"seed": f.seed, "key": f.key, "path": str(f.path), "ops": f.shrunk_ops}
            for f in report.findings
        ],
        "infra": report.infra,
    }
