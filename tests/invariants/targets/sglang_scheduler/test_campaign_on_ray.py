"""Campaigns on a real engine (SGLang 0.5.10.post1's scheduler, where the explorer finds the
#22862 leak and the session crashes): a Ray cluster on loopback finds the failures the local
run finds for the same seeds; a campaign SIGKILLed mid-job and resumed ends with the table of
a campaign never stopped, with its findings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from invariants.campaigns.run import run_campaign
from invariants.campaigns.table import campaign_json
from invariants.fleet import InProcess, Journal
from invariants.fleet.ray_actors import RayActors
from invariants.targets.sglang_scheduler.releases import installed_versions

pytestmark = pytest.mark.sglang
RELEASE = "0.5.10.post1"
KVSPEC = [sys.executable, "-m", "invariants.cli"]


@pytest.fixture(autouse=True)
def _release() -> None:
    if RELEASE not in installed_versions():
        pytest.skip(f"sglang {RELEASE}: make sglang-env SGLANG_VERSION={RELEASE}")


def test_a_campaign_on_ray_finds_what_the_local_run_finds(tmp_path: Path) -> None:
    """The same campaign in this process and on a local Ray cluster (2 CPUs on loopback, an
    actor per CPU holding its driver): the same table — runs, failures, findings, releases."""
    ray = pytest.importorskip("ray", reason="Ray is optional: pip install 'kvspec[ray]'")
    config = write_config(tmp_path)
    local = run_campaign(config, tmp_path / "local", InProcess(), lambda r: None)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with RayActors("local") as actors:
            on_ray = run_campaign(config, tmp_path / "ray", actors, lambda r: None)
            assert actors.size == 2
    finally:
        ray.shutdown()
    as_json = [campaign_json("c", "", r) for r in (local, on_ray)]
    for data, out in zip(as_json, ("local", "ray"), strict=True):
        for job in data["jobs"]:
            job.pop("seconds")
        for finding in data["findings"]:
            finding["replay"] = finding["replay"].replace(str(tmp_path / out), "OUT")
    assert as_json[0] == as_json[1] and as_json[0]["findings"]


def write_config(tmp_path: Path) -> Path:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"name: c\nsteps: 100\njobs:\n  - target: sglang-scheduler\n"
        f"    releases: [{RELEASE}]\n    seeds: 4\n"
    )
    return config


def table(out: Path) -> dict:
    data = json.loads((out / "campaign.json").read_text())
    for job in data["jobs"]:
        job.pop("seconds")
    for finding in data["findings"]:
        finding["replay"] = finding["replay"].replace(str(out), "OUT")
    data.pop("where")
    return data


def test_a_killed_campaign_resumes_to_the_same_table(tmp_path: Path) -> None:
    """SIGKILL once the job has journaled two seeds; --resume OUT → the uninterrupted table."""
    config = write_config(tmp_path)
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    proc = subprocess.Popen([*KVSPEC, "campaign", str(config), "--out", str(stopped)])
    journal = stopped / f"sglang-scheduler-{RELEASE}" / "journal.jsonl"
    while proc.poll() is None:
        if journal.is_file() and len(Journal.read(journal.parent).of("seed")) >= 2:
            os.kill(proc.pid, signal.SIGKILL)
        time.sleep(0.1)
    assert proc.returncode == -signal.SIGKILL
    resumed = subprocess.run([*KVSPEC, "campaign", "--resume", str(stopped)], capture_output=True)
    assert resumed.returncode == 1, resumed.stderr  # findings
    subprocess.run([*KVSPEC, "campaign", str(config), "--out", str(whole)], capture_output=True)
    assert table(stopped) == table(whole) and table(whole)["findings"]
