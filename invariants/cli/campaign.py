"""`kvspec campaign CONFIG.yaml`: targets × releases × budgets as one job, here or on Ray;
one table of findings (each with the releases it was seen on, where first, the replay) and
``OUT/campaign.json``. A killed campaign continues with `kvspec campaign --resume OUT`.

Exit status: 0 no finding, 1 a finding, 2 a config that cannot run (file and line) or a
fleet that cannot start; an infrastructure error (a worker that died twice on one seed) is
listed, never counted as a finding.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from invariants.cli.app import app
from invariants.cli.explore import RayAddress, Workers

if TYPE_CHECKING:
    from invariants.campaigns.run import JobResult


Config = Annotated[Path | None, typer.Argument(help="The campaign's YAML (campaigns/*.yaml).")]
Out = Annotated[Path | None, typer.Option(help="Its folder (default: campaign-out/NAME).")]
Resume = Annotated[
    Path | None,
    typer.Option(help="Continue the campaign in this folder (its config is copied there)."),
]


@app.command("campaign")
def campaign_command(
    config: Config = None,
    out: Out = None,
    workers: Workers = 1,
    ray_address: RayAddress = None,
    resume: Resume = None,
) -> None:
    """Run every job of CONFIG (each target at each release, its seeds) on one fleet of
    workers, each exploration journaled as it goes; print one table of findings."""
    from invariants.campaigns.config import CampaignError, load_campaign
    from invariants.campaigns.run import CONFIG_COPY, resume_campaign, run_campaign
    from invariants.fleet import open_fleet

    if (config is None) == (resume is None):
        raise CampaignError("give a campaign's YAML, or --resume OUT (one of them)")
    name = load_campaign(config or resume / CONFIG_COPY)[0].name  # type: ignore[operator]
    folder = resume or out or Path("campaign-out") / name
    console = Console()
    with open_fleet(workers, ray_address) as fleet:
        if resume is not None:
            results = resume_campaign(resume, fleet, _progress(console))
        else:
            results = run_campaign(config, folder, fleet, _progress(console))  # type: ignore[arg-type]
        where = fleet.where
    raise typer.Exit(_print_campaign(console, name, where, results, folder))


def _progress(console: Console) -> Callable[[JobResult], None]:
    def job_done(result: JobResult) -> None:
        console.print(
            f"{result.job.target} {result.job.release}: {result.runs} runs, "
            f"{result.failing} failing, {len(result.infra)} infra, {result.seconds:.1f} s"
        )

    return job_done


def _print_campaign(
    console: Console, name: str, where: str, results: list[JobResult], folder: Path
) -> int:
    """The tables, each finding's replay, the JSON written; 1 with a finding, else 0."""
    from invariants.campaigns.table import campaign_json, findings_grid, jobs_table, replay_lines
    from invariants.fleet import write_atomic

    console.print(jobs_table(results, where))
    console.print(findings_grid(results))
    for line in replay_lines(results):
        typer.echo(line)
    data = campaign_json(name, where, results)
    path = write_atomic(folder / "campaign.json", json.dumps(data, indent=2) + "\n")
    console.print(f"wrote {path}")
    return 1 if data["findings"] else 0
