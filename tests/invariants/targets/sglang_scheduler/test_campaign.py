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

from invariants.fleet import Journal
from invariants.targets.explore import RealTarget
from invariants.targets.registry import TargetOptions
from invariants.targets.sglang_scheduler.releases import installed_versions
from invariants.targets.streamed import explore_real

pytestmark = pytest.mark.sglang
RELEASE = "0.5.10.post1"
KVSPEC = [sys.executable, "-m", "invariants.cli"]


@pytest.fixture(autouse=True)
def _release() -> None:
    if RELEASE not in installed_versions():
        pytest.skip(f"sglang {RELEASE}: make sglang-env SGLANG_VERSION={RELEASE}")


def failures(report) -> list[tuple[int, str | None]]:
    return [(r.seed, r.key) for r in report.results]


def test_ray_finds_what_the_local_run_finds(tmp_path: Path) -> None:
    """Same seeds, a local Ray cluster (2 CPUs, an actor per CPU holding its driver): the
    same results seed by seed, and the same shrunk finding."""
    ray = pytest.importorskip("ray", reason="Ray is optional: pip install 'kvspec[ray]'")
    target = RealTarget("sglang-scheduler", TargetOptions(version=RELEASE))
    kw = {"max_shrunk": 1, "shrink_budget": 8}
    local = explore_real(target, 4, 120, out_dir=tmp_path / "local", **kw)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = explore_real(target, 4, 120, out_dir=tmp_path / "ray", ray_address="local", **kw)
    finally:
        ray.shutdown()
    assert on_ray.where.startswith("2 Ray actors")
    assert failures(on_ray) == failures(local) and local.failed
    assert [(f.seed, f.key, f.shrunk_ops) for f in on_ray.findings] == [
        (f.seed, f.key, f.shrunk_ops) for f in local.findings
    ]


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
    config = tmp_path / "c.yaml"
    config.write_text(
        f"name: c\nsteps: 100\njobs:\n  - target: sglang-scheduler\n"
        f"    releases: [{RELEASE}]\n    seeds: 4\n"
    )
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    proc = subprocess.Popen([*KVSPEC, "campaign", str(config), "--out", str(stopped)])
    journal = stopped / f"sglang-scheduler-{RELEASE}" / "journal.jsonl"
    while proc.poll() is None:
        if journal.is_file() and len(Journal.resume(journal.parent).of("seed")) >= 2:
            os.kill(proc.pid, signal.SIGKILL)
        time.sleep(0.1)
    assert proc.returncode == -signal.SIGKILL
    resumed = subprocess.run([*KVSPEC, "campaign", "--resume", str(stopped)], capture_output=True)
    assert resumed.returncode == 1, resumed.stderr  # findings
    subprocess.run([*KVSPEC, "campaign", str(config), "--out", str(whole)], capture_output=True)
    assert table(stopped) == table(whole) and table(whole)["findings"]
