"""A campaign run as one job (`kvspec campaign CONFIG.yaml`): its explorations one after the
other on one fleet (this process, local workers or Ray actors: the workers and what they
loaded outlive each exploration), each journaled in its own folder, then one table.

Keeps: nothing already seen is lost — each exploration's journal is written as results come
(invariants/fleet/journal.py), and ``--resume OUT`` continues each job where it stopped, the
finished ones read back; a job's journal of other parameters is an error, never mixed in.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from invariants.campaigns.config import ENGINE, CampaignError, Job, load_campaign
from invariants.explore.streamed import Exploration, explore_header
from invariants.fleet import Fleet, Journal
from invariants.targets.explore import RealTarget
from invariants.targets.streamed import SeedStream, real_header
from invariants.targets.text import target_flags

CONFIG_COPY = "campaign.yaml"
NOT_WRITTEN = "(a mutant over the shrink limit: not written)"


@dataclass(frozen=True, slots=True)
class Failure:
    """The first failing seed of a key in one job: what reproduces it."""

    key: str
    seed: int
    run: str  # the run's name (a mutant's: "seed 5 m120")
    detail: str
    replay: str


@dataclass(slots=True)
class JobResult:
    """One exploration of the campaign, as the table needs it."""

    job: Job
    version: str  # the engine's own version, as its driver said it (kvspec: kvspec)
    runs: int = 0
    failing: int = 0
    infra: list[str] = field(default_factory=list)
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)  # the first of each key


def run_campaign(
    config: Path,
    out: Path,
    fleet: Fleet,
    progress: Callable[[JobResult], None],
    resume: bool = False,
) -> list[JobResult]:
    """Every job of ``config`` on ``fleet``, journaled under ``out`` (a copy of the config
    there, for ``resume_campaign``); ``resume``: each job continues from its journal."""
    _, jobs = load_campaign(config)
    out.mkdir(parents=True, exist_ok=True)
    if config.resolve() != (out / CONFIG_COPY).resolve():
        shutil.copyfile(config, out / CONFIG_COPY)
    results = []
    for job in jobs:
        results.append(run_job(job, out / job.name, fleet, resume))
        progress(results[-1])
    return results


def resume_campaign(
    out: Path, fleet: Fleet, progress: Callable[[JobResult], None]
) -> list[JobResult]:
    """The campaign in ``out``, continued: its config read from the copy there."""
    if not (out / CONFIG_COPY).is_file():
        raise CampaignError(f"--resume {out}: no {CONFIG_COPY} there (not a campaign's folder)")
    return run_campaign(out / CONFIG_COPY, out, fleet, progress, resume=True)


def run_job(job: Job, out: Path, fleet: Fleet, resume: bool = False) -> JobResult:
    """One job: its exploration started, or (``resume``) continued where its journal
    stopped."""
    start = time.perf_counter()
    result = (_engine_job if job.target == ENGINE else _real_job)(job, out, fleet, resume)
    result.seconds = time.perf_counter() - start
    return result


def _engine_job(job: Job, out: Path, fleet: Fleet, resume: bool) -> JobResult:
    header = explore_header(job.seeds, job.steps, job.seed_start)
    report = Exploration(_journal(out, header, resume), fleet).run()
    result = JobResult(job, ENGINE, len(report.results), len(report.failed), report.infra)
    shrunk = {f.name: f"kvspec replay {f.path}" for f in report.findings}
    for r in _firsts(report.failed, lambda r: r.failure):
        again = _unshrunk(job, r.seed) if r.name == f"seed {r.seed}" else NOT_WRITTEN
        result.failures.append(
            Failure(str(r.failure), r.seed, r.name, r.detail, shrunk.get(r.name, again))
        )
    return result


def _real_job(job: Job, out: Path, fleet: Fleet, resume: bool) -> JobResult:
    target = RealTarget(job.target, job.options)
    header = real_header(target, job.seeds, job.steps, job.seed_start)
    real = SeedStream(_journal(out, header, resume)).run(fleet)
    result = JobResult(job, real.version, len(real.results), len(real.failed), real.infra)
    flags = target_flags(job.target, job.options)
    shrunk = {f.seed: f"kvspec replay {f.path} {flags}" for f in real.findings}
    for s in _firsts(real.failed, lambda s: s.key):
        replay = shrunk.get(s.seed, _unshrunk(job, s.seed))
        result.failures.append(Failure(str(s.key), s.seed, f"seed {s.seed}", s.detail, replay))
    return result


def _journal(out: Path, header: dict[str, object], resume: bool) -> Journal:
    """The job's journal: continued when ``resume`` and one is there (of these parameters),
    else started afresh."""
    if not resume or not (out / "journal.jsonl").is_file():
        return Journal.start(out, header)
    journal = Journal.resume(out, str(header["kind"]))
    if journal.header != header:
        differ = sorted(k for k in header if journal.header.get(k) != header[k])
        raise CampaignError(
            f"{out}: its journal is of other parameters ({', '.join(differ)}); "
            "move it away or give the job another name"
        )
    return journal


def _firsts(failed: list[Any], key: Callable[[Any], object]) -> list[Any]:
    """The first failing result of each key, in run order."""
    seen: dict[str, object] = {}
    for result in failed:
        if key(result) != "config":
            seen.setdefault(str(key(result)), result)
    return list(seen.values())


def _unshrunk(job: Job, seed: int) -> str:
    """The command that reruns a fresh seed (a failure over the shrink limit)."""
    flags = "" if job.target == ENGINE else " " + target_flags(job.target, job.options)
    return f"kvspec explore --seeds 1 --steps {job.steps} --seed-start {seed}{flags}"
