"""A campaign run on a fleet and journaled as it goes (``explore``, ``resume``): runs handed
to workers, each result recorded the moment it arrives, the first failing run of each failure
key shrunk once on a worker, the report rewritten as results come.

Keeps: in the deterministic mode a generation's results are taken in run order behind a
barrier (campaign.py), so the report is the same for any number of workers and after any
resume; in the streamed mode (Ray's default) a run is issued whenever one finishes, from the
corpus as it stands (``Campaign.next_one``), and each issued mutant is journaled first so a
resume runs it as it was drawn. A run whose worker died twice is an infrastructure error: in
the journal and the report, never in the corpus and never a finding.
"""

from __future__ import annotations

import time
from pathlib import Path

from invariants.explore.campaign import Campaign, Run, RunResult
from invariants.explore.ddmin import SHRINK_BUDGET
from invariants.explore.explorer import (
    DEFAULT_SEEDS,
    DEFAULT_STEPS,
    FAILURE_DIR,
    MAX_SHRUNK,
    ExploreReport,
    Finding,
    run_task,
    shrink_failing,
)
from invariants.explore.report import write_report_json
from invariants.fleet import Done, Fleet, Journal, JournalError, Task, open_fleet, write_atomic
from invariants.scenarios.ops import Trace

REPORT_EVERY_S = 2.0  # the streamed report.json is rewritten at most this often (and at the end)


class Exploration:
    """One journaled campaign on one fleet (see the module docstring)."""

    def __init__(self, journal: Journal, fleet: Fleet) -> None:
        h = journal.header
        self.journal, self.fleet, self.out = journal, fleet, journal.path.parent
        self.campaign = Campaign(h["seeds"], h["steps"], h["seed_start"])
        self.report = ExploreReport(where=fleet.where)
        self.arrived: dict[int, RunResult | None] = {}  # None: no worker could run it
        self.done = {r["index"]: RunResult.from_record(r) for r in journal.of("run")}
        self.report.findings = [Finding.from_record(f) for f in journal.of("finding")]
        self.report.infra = [i["why"] for i in journal.of("infra")]
        self.lost = {i["index"] for i in journal.of("infra")}  # stays an infra error on resume
        self.keys = {f.key for f in self.report.findings}  # shrunk, or being shrunk
        self.shrinking: dict[str, RunResult] = {}
        self.runs_out, self.stopping = 0, False
        self.start, self.written = time.perf_counter(), 0.0

    def run(self) -> ExploreReport:
        if self.journal.header["deterministic"]:
            self._generations()
        else:
            self._streamed()
        while self.fleet.in_flight:  # the shrinks still running
            self._handle(self.fleet.next_done())
        self.report.results.sort(key=lambda r: r.index)
        self.report.findings.sort(key=lambda f: (f.seed, f.name))
        self._write_report(final=True)
        return self.report

    def _generations(self) -> None:
        """Generation by generation, each taken in run order behind a barrier."""
        while not self.campaign.done and not self.stopping:
            runs = self.campaign.next_generation()
            for run in runs:
                self._issue(run)
            while any(run.index not in self.arrived for run in runs):
                self._handle(self.fleet.next_done())
            arrived = [self.arrived.pop(run.index) for run in runs]
            results = [r for r in arrived if r is not None]
            self.campaign.take(results)
            for result in results:
                if not self.stopping:
                    self._take(result)

    def _streamed(self) -> None:
        """A run issued whenever one finishes, ``2 ×`` the fleet's size kept running."""
        self._restore_streamed()
        while True:
            while self._may_issue() and self.runs_out < 2 * self.fleet.size:
                run = self.campaign.next_one()
                if run.trace is not None:  # a resume must run it as it was drawn
                    self.journal.append({"issued": _issued(run)})
                self._issue(run)
            if not self.runs_out:
                return
            self._handle(self.fleet.next_done())
            for index in list(self.arrived):
                result = self.arrived.pop(index)
                if result is not None:
                    self.campaign.take([result])
                    self._take(result)

    def _may_issue(self) -> bool:
        return not self.campaign.done and not self.stopping

    def _restore_streamed(self) -> None:
        """The corpus rebuilt from the journal (runs taken in the order they arrived); runs
        issued and unfinished are run again as they were drawn."""
        campaign = self.campaign
        mutants = {r["index"]: _run_of(r) for r in self.journal.of("issued")}
        campaign.restore(mutants, [*self.done, *self.lost])
        for result in self.done.values():  # the journal's order: the order they arrived
            campaign.take([result])
            self._take(result)
        for index in range(campaign.issued):
            if index not in self.done and index not in self.lost:
                self._issue(campaign.runs[index])

    def _issue(self, run: Run) -> None:
        """Hand ``run`` to the fleet, or take its journaled result (a resume)."""
        if run.index in self.lost:
            self.arrived[run.index] = None
            return
        if run.index in self.done:
            earlier = self.done[run.index]
            if earlier.name != run.name:  # the journal of another kvspec's campaign
                raise JournalError(
                    f"{self.journal.path}: run {run.index} was {earlier.name}, is {run.name} "
                    "now: this kvspec draws another campaign; start it afresh"
                )
            self.arrived[run.index] = earlier
            return
        self.runs_out += 1
        self.fleet.submit(Task(("run", run.index), run_task, (run, self.campaign.steps)))

    def _handle(self, done: Done) -> None:
        """A finished task: a run's result journaled the moment it arrives, or a shrink."""
        kind, name = done.task.key
        if kind == "shrink":
            self._shrunk(self.shrinking.pop(name), done)
            return
        self.runs_out -= 1
        if done.infra is not None:
            why = f"{self.campaign.runs[name].name}: {done.infra}"
            self.journal.append({"infra": {"index": name, "why": why}})
            self.report.infra.append(why)
            self.arrived[name] = None
            return
        self.journal.append({"run": done.result.record()})
        self.arrived[name] = done.result

    def _take(self, result: RunResult) -> None:
        """A result taken into the report; the first failing run of a key is written at once
        and handed to a worker to shrink."""
        self.report.results.append(result)
        key = result.failure
        if key is not None and key != "config":
            self.stopping |= bool(self.journal.header["fail_fast"])
            if key not in self.keys and len(self.keys) < self.journal.header["max_shrunk"]:
                self.keys.add(key)
                self.shrinking[key] = result
                trace = self.campaign.trace_of(result.index)
                write_atomic(self._path(result), trace.text())  # unshrunk, until shrunk
                budget = self.journal.header["shrink_budget"]
                self.fleet.submit(Task(("shrink", key), shrink_failing, (trace, key, budget)))
        self._write_report()

    def _shrunk(self, result: RunResult, done: Done) -> None:
        if done.infra is not None:  # the unshrunk trace stays written
            self.report.infra.append(f"shrink of {result.name}: {done.infra}")
            return
        small, runs, _ = done.result
        path, stem = self._path(result), result.name.replace(" ", "-")
        write_atomic(path, small.model_copy(update={"name": f"explore-{stem}-shrunk"}).text())
        finding = Finding(
            result.seed, str(result.failure), result.detail, path, result.ops, len(small.ops),
            runs, result.name,
        )  # fmt: skip
        self.journal.append({"finding": finding.record()})
        self.report.findings.append(finding)
        self._write_report()

    def _path(self, result: RunResult) -> Path:
        return self.out / f"{result.name.replace(' ', '-')}.json"

    def _write_report(self, final: bool = False) -> None:
        """``OUT/report.json`` rewritten (atomically), at most every ``REPORT_EVERY_S``."""
        now = time.perf_counter()
        if not final and now - self.written < REPORT_EVERY_S:
            return
        self.written = now
        self.report.corpus = len(self.campaign.corpus)
        self.report.seconds = now - self.start
        write_report_json(self.report, self.campaign.steps, self.out / "report.json")


def _issued(run: Run) -> dict[str, object]:
    assert run.trace is not None
    return {"index": run.index, "seed": run.seed, "trace": run.trace.model_dump(mode="json")}


def _run_of(record: dict[str, object]) -> Run:
    trace = Trace.model_validate(record["trace"])
    return Run(int(record["index"]), int(record["seed"]), trace)  # type: ignore[call-overload]


def explore(
    seeds: int = DEFAULT_SEEDS,
    steps: int = DEFAULT_STEPS,
    *,
    seed_start: int = 0,
    workers: int = 1,
    fail_fast: bool = False,
    out_dir: Path = FAILURE_DIR,
    max_shrunk: int = MAX_SHRUNK,
    shrink_budget: int = SHRINK_BUDGET,
    ray_address: str | None = None,
    deterministic: bool | None = None,
) -> ExploreReport:
    """Run a campaign of ``seeds`` runs from ``seed_start`` on ``workers`` processes (or Ray
    actors at ``ray_address``), journaled in ``out_dir``; shrink the first failing run of each
    distinct failure key (at most ``max_shrunk``) into ``out_dir``. ``deterministic`` (default:
    unless on Ray): generations with a barrier, the same report for any number of workers."""
    on_ray = ray_address is not None
    header = explore_header(
        seeds, steps, seed_start, fail_fast, max_shrunk, shrink_budget,
        not on_ray if deterministic is None else deterministic,
    )  # fmt: skip
    return run_journaled(Journal.start(out_dir, header), workers, ray_address)


def explore_header(
    seeds: int = DEFAULT_SEEDS,
    steps: int = DEFAULT_STEPS,
    seed_start: int = 0,
    fail_fast: bool = False,
    max_shrunk: int = MAX_SHRUNK,
    shrink_budget: int = SHRINK_BUDGET,
    deterministic: bool = True,
) -> dict[str, object]:
    """What the journal says the campaign is (all a resume needs)."""
    return {
        "kind": "explore",
        "seeds": seeds,
        "steps": steps,
        "seed_start": seed_start,
        "fail_fast": fail_fast,
        "max_shrunk": max_shrunk,
        "shrink_budget": shrink_budget,
        "deterministic": deterministic,
    }


def resume(out_dir: Path, workers: int = 1, ray_address: str | None = None) -> ExploreReport:
    """Continue the campaign journaled in ``out_dir`` where it stopped: finished runs are
    read back, not run again; the rest runs as the first invocation would have run it."""
    return run_journaled(Journal.resume(out_dir, "explore"), workers, ray_address)


def run_journaled(journal: Journal, workers: int, ray_address: str | None) -> ExploreReport:
    with open_fleet(workers, ray_address) as fleet:
        return Exploration(journal, fleet).run()
