"""A campaign's YAML (`kvspec campaign CONFIG.yaml`): which targets, which of their releases,
how many seeds each — expanded into jobs, one exploration per (target, release).

Keeps: every problem is one ``path:line: field: reason`` line before anything runs (an
unknown target, releases on a target without per-release venvs, ``installed`` with none
built); the config is copied into the campaign's folder so ``--resume OUT`` needs nothing else.

    name: nightly
    seeds: 40                 # per job unless the job says (default: the target's own)
    jobs:
      - target: kvspec
        seeds: 200
      - target: sglang-scheduler
        releases: installed   # or a list: [0.5.23, 0.5.10.post1]
      - target: vllm
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from invariants.checking.loader import locate, read_yaml
from invariants.explore import DEFAULT_SEEDS, DEFAULT_STEPS
from invariants.targets.explore import DEFAULT_SEEDS as REAL_SEEDS
from invariants.targets.explore import DEFAULT_STEPS as REAL_STEPS
from invariants.targets.registry import NAMES, TargetOptions
from invariants.targets.registry import target as registered

ENGINE = "kvspec"  # kvspec's own engine: the coverage-guided explorer


class CampaignError(ValueError):
    """A campaign file that cannot run; one ``path:line: field: reason`` line per problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobSpec(_Strict):
    target: str
    releases: list[str] | Literal["installed"] | None = None
    python: str | None = None  # an interpreter (a venv, a checkout) instead of a release
    seeds: int | None = Field(default=None, ge=1)
    steps: int | None = Field(default=None, ge=1)
    seed_start: int = Field(default=0, ge=0)


class CampaignSpec(_Strict):
    name: str = Field(pattern=r"^[\w.-]+$")
    seeds: int | None = Field(default=None, ge=1)
    steps: int | None = Field(default=None, ge=1)
    jobs: list[JobSpec] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Job:
    """One exploration of a campaign: a target at one release (or interpreter)."""

    target: str
    options: TargetOptions
    seeds: int
    steps: int
    seed_start: int

    @property
    def release(self) -> str:
        """The release asked for, as the table shows it."""
        return self.options.version or self.options.python or "default"

    @property
    def name(self) -> str:
        """Its folder in the campaign's: the target and release."""
        tail = self.options.version or ("python" if self.options.python else "default")
        return f"{self.target}-{tail}"


def load_campaign(path: Path) -> tuple[CampaignSpec, list[Job]]:
    """The campaign in ``path`` and its jobs; ``CampaignError`` naming file and line."""
    try:
        raw = read_yaml(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CampaignError(f"{path}: cannot read the campaign ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"{mark.line + 1}:" if mark is not None else ""
        raise CampaignError(f"{path}:{line} YAML error: {getattr(exc, 'problem', exc)}") from None
    try:
        spec = CampaignSpec.model_validate(raw if isinstance(raw, dict) else {})
    except ValidationError as exc:
        lines = [
            f"{path}:{locate(raw, e['loc'])}: {'.'.join(map(str, e['loc'])) or 'campaign'}: "
            f"{e['msg']}"
            for e in exc.errors()
        ]
        raise CampaignError("\n".join(lines)) from None
    jobs, problems = [], []
    for i, job in enumerate(spec.jobs):
        try:
            jobs += expand(spec, job)
        except CampaignError as exc:
            problems.append(f"{path}:{locate(raw, ('jobs', i, 'target'))}: jobs.{i}: {exc}")
    if problems:
        raise CampaignError("\n".join(problems))
    return spec, jobs


def expand(spec: CampaignSpec, job: JobSpec) -> list[Job]:
    """``job`` as one Job per release it names (the target's default release: one)."""
    if job.target != ENGINE and job.target not in NAMES:
        raise CampaignError(f"target {job.target!r}: choose one of {', '.join((ENGINE, *NAMES))}")
    if job.target != ENGINE and not registered(job.target).explores:
        raise CampaignError(f"target {job.target!r} does not explore (its adapter draws no seeds)")
    per_release = job.target != ENGINE and registered(job.target).releases
    if job.releases is not None and not per_release:
        raise CampaignError(f"target {job.target!r} has no per-release venvs: use python:")
    if job.releases is not None and job.python is not None:
        raise CampaignError("releases and python are exclusive: one names the interpreter")
    releases: list[str | None] = [None]
    if job.releases == "installed":
        releases = list(registered(job.target).installed_releases())
        if not releases:
            raise CampaignError(f"releases: installed, but no release of {job.target} is built")
    elif job.releases is not None:
        releases = list(job.releases)
    engine = job.target == ENGINE
    seeds = job.seeds or spec.seeds or (DEFAULT_SEEDS if engine else REAL_SEEDS)
    steps = job.steps or spec.steps or (DEFAULT_STEPS if engine else REAL_STEPS)
    return [
        Job(job.target, TargetOptions(job.python, r), seeds, steps, job.seed_start)
        for r in releases
    ]
