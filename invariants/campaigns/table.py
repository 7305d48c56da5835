"""A campaign's one table (release × finding) and its JSON: a failure key seen on several
releases of one target is one finding with its release list, the release it was first seen
on (in the config's order), and the command that replays it there.

Keeps: the table is built from the jobs' results only, so a resumed campaign prints the same
table as one that was never stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from invariants.campaigns.run import Failure, JobResult


@dataclass(slots=True)
class Finding:
    """One failure key on one target, over every release it was seen on."""

    target: str
    key: str
    first: Failure  # where it was first seen
    first_release: str
    releases: list[str] = field(default_factory=list)


def merged(results: Sequence[JobResult]) -> list[Finding]:
    """The findings of every job, one per (target, key across releases), in the order first
    seen."""
    found: dict[tuple[str, str], Finding] = {}
    for result in results:
        for failure in result.failures:
            at = (result.job.target, release_neutral(failure.key))
            release = result.job.release
            finding = found.setdefault(at, Finding(*at, failure, release))
            if release not in finding.releases:
                finding.releases.append(release)
    return list(found.values())


def release_neutral(key: str) -> str:
    """A failure key without the folders of its raising site: a crash in
    ``sglang/srt/managers/session_controller.py:create_req`` on one release and in
    ``sglang/srt/session/session_controller.py:create_req`` on a later one (the module moved)
    is one finding."""
    rule, at, site = key.partition("@")
    return f"{rule}@{site.rsplit('/', 1)[-1]}" if at else key


def findings_grid(results: Sequence[JobResult]) -> Table:
    """Release × finding: ``first`` where a finding was first seen, ``x`` where seen again."""
    releases = list(dict.fromkeys(r.job.release for r in results))
    table = Table(title="findings × releases", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("target")
    table.add_column("failure key", overflow="fold")
    for release in releases:
        table.add_column(release, justify="center")
    for i, f in enumerate(merged(results), 1):
        marks = [
            "first" if r == f.first_release else "x" if r in f.releases else "" for r in releases
        ]
        table.add_row(str(i), f.target, f.key, *marks)
    return table


def replay_lines(results: Sequence[JobResult]) -> list[str]:
    """Each finding's first sighting and the command that replays it, numbered as the grid."""
    return [
        f"{i}. {f.key} ({f.target} {f.first_release}, {f.first.run}): {f.first.detail[:200]}\n"
        f"   replay: {f.first.replay}"
        for i, f in enumerate(merged(results), 1)
    ]


def jobs_table(results: Sequence[JobResult], where: str) -> Table:
    table = Table(title=f"jobs ({where})", title_justify="left")
    for column in ("target", "release", "engine", "runs", "failing", "infra", "s", "runs/s"):
        table.add_column(column, justify="left" if column in ("target", "release") else "right")
    for r in results:
        rate = r.runs / r.seconds if r.seconds else 0.0
        table.add_row(
            r.job.target, r.job.release, r.version, str(r.runs), str(r.failing),
            str(len(r.infra)), f"{r.seconds:.1f}", f"{rate:.2f}",
        )  # fmt: skip
    return table


def campaign_json(name: str, where: str, results: Sequence[JobResult]) -> dict[str, Any]:
    """The campaign as JSON: every job, every finding with its releases and replay."""
    return {
        "campaign": name,
        "where": where,
        "jobs": [
            {
                "target": r.job.target,
                "release": r.job.release,
                "engine_version": r.version,
                "seeds": r.job.seeds,
                "steps": r.job.steps,
                "runs": r.runs,
                "failing": r.failing,
                "infra": r.infra,
                "seconds": round(r.seconds, 2),
            }
            for r in results
        ],
        "findings": [
            {
                "target": f.target,
                "key": f.key,
                "releases": f.releases,
                "first_seen": {"release": f.first_release, "run": f.first.run},
                "detail": f.first.detail,
                "replay": f.first.replay,
            }
            for f in merged(results)
        ],
    }
