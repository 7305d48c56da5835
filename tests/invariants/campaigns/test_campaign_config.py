"""A campaign's YAML (invariants/campaigns/config.py): each problem is one line naming the
file, the line and the field, before anything runs; a valid one expands to one job per
(target, release), budgets from the job, else the campaign, else the target's default."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from invariants.campaigns.config import CampaignError, load_campaign
from invariants.cli import app
from invariants.explore import DEFAULT_SEEDS
from invariants.targets.explore import DEFAULT_STEPS as REAL_STEPS


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_jobs_expand_per_release_with_budgets(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: n\nseeds: 7\njobs:\n  - target: kvspec\n    seeds: 3\n"
        "  - target: sglang-scheduler\n    releases: [0.5.23, 0.5.10.post1]\n  - target: vllm\n",
    )
    spec, jobs = load_campaign(path)
    assert spec.name == "n"
    assert [(j.name, j.seeds) for j in jobs] == [
        ("kvspec-default", 3),
        ("sglang-scheduler-0.5.23", 7),
        ("sglang-scheduler-0.5.10.post1", 7),
        ("vllm-default", 7),
    ]
    assert jobs[1].steps == REAL_STEPS and jobs[1].release == "0.5.23"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("name: n\njobs:\n  - target: nope\n", r"c.yaml:3: jobs.0: target 'nope': choose one"),
        ("name: n\njobs:\n  - target: kvspec\n    releases: [x]\n", r"c.yaml:3: .*no per-release"),
        (
            "name: n\njobs:\n  - target: kvspec\n    seeds: 0\n",
            r"c.yaml:4: jobs.0.seeds: .*greater than or equal to 1",
        ),
        ("name: n\njobs:\n  - target: kvspec\n    sedes: 3\n", r"c.yaml:4: jobs.0.sedes: Extra"),
        ("name: n\njobs: []\n", r"c.yaml:2: jobs: .*at least 1"),
        ("name: [\n", r"c.yaml:2: YAML error"),
    ],
)
def test_a_bad_campaign_names_file_line_and_field(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(CampaignError, match=error):
        load_campaign(write(tmp_path, text))


def test_the_command_says_it_in_one_line_exit_2(tmp_path: Path) -> None:
    """`kvspec campaign` on a bad file: exit 2, the line; nothing written."""
    from invariants.cli import main

    path = write(tmp_path, "name: n\njobs:\n  - target: nope\n")
    with pytest.raises(SystemExit) as stop:
        main(["campaign", str(path), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2 and not (tmp_path / "out").exists()


def test_a_kvspec_campaign_prints_its_table_and_json(tmp_path: Path) -> None:
    """A small campaign of kvspec's engine: the jobs table, no finding, the JSON written."""
    path = write(tmp_path, "name: small\njobs:\n  - target: kvspec\n    seeds: 4\n    steps: 60\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["campaign", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "findings × releases" in result.output and (out / "campaign.yaml").is_file()
    data = __import__("json").loads((out / "campaign.json").read_text())
    assert data["jobs"][0]["runs"] == 4 and data["findings"] == []
    assert DEFAULT_SEEDS > 4
