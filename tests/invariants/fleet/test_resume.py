"""Nothing lost (invariants/fleet/journal.py, explore/streamed.py): a campaign SIGKILLed
mid-way and continued with ``--resume OUT`` ends with the report of a campaign never stopped
(deterministic mode), runs no finished run again, and in the streamed mode ends with its whole
budget run once each; on a local Ray cluster the deterministic mode reports what the local run
reports for the same seeds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from invariants.explore import explore
from invariants.explore.streamed import Exploration, explore_header
from invariants.fleet import Done, InProcess, Journal, JournalError, write_atomic

KVSPEC = [sys.executable, "-m", "invariants.cli"]
SEEDS, STEPS = 40, 60


def runs_in(out: Path) -> list[dict]:
    return Journal.read(out, "explore").of("run")


def killed_after(args: list[str], out: Path, runs: int) -> int:
    """Start ``kvspec explore ARGS``, SIGKILL it once ``runs`` results are journaled."""
    proc = subprocess.Popen([*KVSPEC, "explore", *args], stdout=subprocess.DEVNULL)
    try:
        while proc.poll() is None:
            if (out / "journal.jsonl").is_file() and len(runs_in(out)) >= runs:
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "finished before it could be killed"
    return len(runs_in(out))


def comparable(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    return {k: v for k, v in report.items() if k not in ("seconds", "where")}


def test_a_killed_campaign_resumes_to_the_same_report(tmp_path: Path) -> None:
    """Deterministic mode: killed after 12 runs, resumed → the uninterrupted report; the
    journal holds each run once (the finished ones were read back, not run again)."""
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    args = ["--seeds", str(SEEDS), "--steps", str(STEPS), "--no-coverage"]
    before = killed_after([*args, "--out", str(stopped)], stopped, 12)
    assert 12 <= before < SEEDS
    resumed = [*KVSPEC, "explore", "--resume", str(stopped), "--no-coverage"]
    subprocess.run(resumed, check=True, capture_output=True)
    subprocess.run(
        [*KVSPEC, "explore", *args, "--out", str(whole)], check=True, capture_output=True
    )
    assert comparable(stopped) == comparable(whole)
    indices = [r["index"] for r in runs_in(stopped)]
    assert sorted(indices) == list(range(SEEDS)), "a run was repeated or lost"


def test_a_killed_streamed_campaign_runs_its_budget_once(tmp_path: Path) -> None:
    """Streamed mode on 2 workers: killed with runs in flight, resumed → every index of the
    budget run exactly once; the mutants issued before the kill ran as they were drawn."""
    out = tmp_path / "streamed"
    args = ["--seeds", str(SEEDS), "--steps", str(STEPS), "--no-coverage", "--streamed"]
    killed_after([*args, "--workers", "2", "--out", str(out)], out, 24)
    issued = {r["index"]: r["trace"] for r in Journal.read(out).of("issued")}
    resumed = [*KVSPEC, "explore", "--resume", str(out), "--no-coverage", "--workers", "2"]
    subprocess.run(resumed, check=True, capture_output=True)
    journal = Journal.read(out)
    assert sorted(r["index"] for r in journal.of("run")) == list(range(SEEDS))
    again = {r["index"]: r["trace"] for r in journal.of("issued")}
    assert all(again[i] == trace for i, trace in issued.items())
    assert len(comparable(out)["coverage"]["goals"]) > 0 and comparable(out)["runs"] == SEEDS


def test_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    """A kill mid-append leaves half a line: the journal reads back without it."""
    journal = Journal.start(tmp_path, {"kind": "explore", "seeds": 1})
    journal.append({"run": {"index": 0}})
    with journal.path.open("a") as file:
        file.write('{"run": {"ind')
    assert Journal.read(tmp_path, "explore").of("run") == [{"index": 0}]
    write_atomic(tmp_path / "x.json", "{}")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".x.json")] == []


def test_ray_deterministic_mode_reports_what_the_local_run_reports(tmp_path: Path) -> None:
    """A local Ray cluster on loopback (2 CPUs), --deterministic: the same runs, failures,
    coverage and corpus as one local process for the same seeds."""
    ray = pytest.importorskip("ray", reason="Ray is optional: pip install 'kvspec[ray]'")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = explore(
            24, STEPS, out_dir=tmp_path / "ray", ray_address="local", deterministic=True
        )
    finally:
        ray.shutdown()
    local = explore(24, STEPS, out_dir=tmp_path / "local")
    assert on_ray.where.startswith("2 Ray actors")
    assert comparable(tmp_path / "ray") == comparable(tmp_path / "local")
    assert [(r.name, r.failure) for r in on_ray.results] == [
        (r.name, r.failure) for r in local.results
    ]


class LosesRunThree(InProcess):
    """This process, but the worker holding run 3 'died twice'."""

    def next_done(self) -> Done:
        task = self.queue[0]
        if task.key == ("run", 3):
            self.queue.popleft()
            return Done(task, infra="its worker died 2 times (exit code -9)")
        return super().next_done()


def test_a_run_no_worker_could_finish_is_an_infra_error(tmp_path: Path) -> None:
    """Reported and journaled as infrastructure, never a finding, never in the corpus; the
    other runs are unaffected."""
    header = explore_header(8, STEPS, deterministic=True)
    report = Exploration(Journal.start(tmp_path, header), LosesRunThree()).run()
    assert report.infra == ["seed 3: its worker died 2 times (exit code -9)"]
    assert [r.index for r in report.results] == [0, 1, 2, 4, 5, 6, 7] and not report.failed
    assert json.loads((tmp_path / "report.json").read_text())["infra"] == report.infra
    assert Journal.read(tmp_path).of("infra")[0]["index"] == 3
    again = Exploration(Journal.resume(tmp_path), InProcess()).run()  # read back, not rerun
    assert again.infra == report.infra and [r.index for r in again.results] == [0, 1, 2, 4, 5, 6, 7]


def test_one_campaign_writes_a_folder_at_a_time(tmp_path: Path) -> None:
    """A second campaign on a folder another process is writing is refused, naming it; the
    lock goes with the process that held it (a SIGKILL frees it)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from invariants.fleet.journal import lock_folder; lock_folder(Path(sys.argv[1])); "
         "print('held', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(JournalError, match="another campaign is writing there"):
        Journal.start(tmp_path, {"kind": "explore"})
    holder.kill()
    holder.wait()
    Journal.start(tmp_path, {"kind": "explore"}).release()
