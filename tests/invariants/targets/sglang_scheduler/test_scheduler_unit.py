"""The kvspec side of the sglang-scheduler target, without sglang: which releases it knows,
how a moved release and a missing one are said, how a run's findings are keyed, classified
and turned into report rows and history rows."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from invariants.checking.checker import Violation
from invariants.cli import app
from invariants.report.scheduler_rows import scheduler_row
from invariants.scenarios.ops import Step, Trace
from invariants.targets.sglang_scheduler.explore import failure_key
from invariants.targets.sglang_scheduler.history import pages_named, rows_of
from invariants.targets.sglang_scheduler.run import SchedulerOutcome, SchedulerStats, SGLangFinding
from invariants.targets.sglang_scheduler.target import (
    SchedulerDriver,
    ShimDrift,
    shim_path,
    supported_versions,
)
from invariants.targets.sglang.target import SGLangUnavailable

LEAK = "full: leaked pages (not free, owned by nobody): [567]"
DRIFT = "AttributeError: type object 'Scheduler' has no attribute 'recv_requests'"


def outcome(violations=(), sglang=(), error=None) -> SchedulerOutcome:
    trace = Trace(name="t", ops=[Step(n=3)])
    return SchedulerOutcome(
        trace, "0.5.10.post1", SchedulerStats(iterations=30), tuple(violations), tuple(sglang),
        checks=10, seconds=0.1, error=error, stopped_at=0 if violations else None,
    )  # fmt: skip


def violation(invariant: str, step: int, message: str = "m") -> Violation:
    return Violation(invariant, invariant, "step", step, message)


def fake_python(tmp_path: Path, answer: str) -> Path:
    """An interpreter stand-in: prints the 0.5.23 driver's banner, then ``answer`` to the
    first op (the trace's config)."""
    script = tmp_path / "python"
    banner = '{"ready": true, "sglang": "0.5.23", "shim": "shim_0_5_23", "not_applicable": {}}'
    script.write_text(f"#!/bin/sh\necho '{banner}'\nread line\necho '{answer}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_supported_releases_are_the_shim_modules_only():
    """A release is supported when driver/shim_<version>.py exists; the shared modules
    (shim_common*.py) are not releases."""
    versions = supported_versions()
    assert {"0.5.10.post1", "0.5.11", "0.5.23"} <= set(versions)
    assert all(v[0].isdigit() for v in versions)
    assert all(shim_path(v).exists() for v in versions)


def test_a_release_without_a_shim_is_refused_before_anything_starts():
    """--sglang-version of a release with no shim names the supported ones."""
    with pytest.raises(SGLangUnavailable, match=r"no shim for sglang 0\.5\.9 .*0\.5\.23"):
        SchedulerDriver("0.5.9")


def test_a_missing_venv_names_the_make_target(tmp_path, monkeypatch):
    """A supported release whose venv is not built says which make command builds it."""
    monkeypatch.setattr("invariants.targets.sglang_scheduler.target.ROOT", tmp_path)
    with pytest.raises(SGLangUnavailable, match=r"make sglang-env SGLANG_VERSION=0\.5\.11"):
        SchedulerDriver("0.5.11")


def test_drift_is_one_line_naming_the_attribute_and_the_shim(tmp_path):
    """A release whose internals moved is ShimDrift naming the error and the shim module;
    `kvspec run` prints it on one line and exits 2 — never a traceback, never a finding."""
    answer = f'{{"error": "{DRIFT}", "drift": true, "where": "shim_0_5_23.py:170", "trace": true}}'
    python = fake_python(tmp_path, answer.replace("'", ""))
    with SchedulerDriver(python=python) as driver, pytest.raises(ShimDrift) as raised:
        driver.send({"op": "config"})
    assert "recv_requests" in str(raised.value)
    assert "invariants/targets/sglang_scheduler/driver/shim_0_5_23.py" in str(raised.value)
    args = ["run", "specs/matrix-base.yaml", "--target", "sglang-scheduler"]
    result = CliRunner().invoke(app, [*args, "--sglang-python", str(python)])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("shim drift:")
    assert "Traceback" not in result.output


def test_failure_key_names_every_invariant_of_the_first_failing_view():
    """Explore keys a failure by the kvspec ids of its first failing view (joined by +),
    else SGLang's checker's first words, else the crash, else liveness."""
    first = [violation("pool.busy_sum", 2), violation("census.no_orphans", 2)]
    later = violation("req.protected_le_committed", 5)
    assert failure_key(outcome([*first, later])) == "pool.busy_sum+census.no_orphans"
    message = "memory leak detected! max_total_num_tokens=256, available_size=154"
    key = failure_key(outcome(sglang=[SGLangFinding(1, message)]))
    assert key == "sglang:memory leak detected!"  # counts left out: a shrunk trace leaks less
    assert failure_key(outcome(error="not idle after 200000 steps")) == "liveness"
    assert failure_key(outcome()) is None


def test_history_rows_say_which_side_saw_it():
    """A census finding with SGLang silent is ``census`` and names the leaked page; SGLang's
    checker firing at iterations where kvspec held is one ``sglang-false-positive`` row with
    its count; both at one iteration is ``both``."""
    sglang = [SGLangFinding(1, "Mem Leak Detected! total_tokens=604"), SGLangFinding(3, "again")]
    rows = rows_of(outcome([violation("census.no_orphans", 2, LEAK)], sglang), "s", "replay")
    census, positive = rows
    assert (census.kind, census.invariant, census.iteration, census.pages) == (
        "census", "census.no_orphans", 2, (567,),
    )  # fmt: skip
    assert (positive.kind, positive.iteration, positive.iterations) == (
        "sglang-false-positive", 1, 2,
    )  # fmt: skip
    both = rows_of(outcome([violation("pool.busy_sum", 3)], sglang), "s", "r")[0]
    assert both.kind == "both"
    assert rows_of(outcome(), "s", "r") == []


def test_pages_named_reads_every_page_list_of_the_census():
    """Pages named in census messages (leaked, duplicated) are collected, sorted."""
    named = [violation("a", 1, LEAK), violation("b", 1, "duplicate pages: [3, 9]")]
    assert pages_named(named) == (3, 9, 567)


def test_report_row_fails_on_sglangs_own_checker_alone():
    """On the report, SGLang's own checker firing fails the row even with kvspec clean, and
    the disagreement is named in the row's notes."""
    fired = outcome(sglang=[SGLangFinding(9, "Mem Leak Detected! total_tokens=8199")])
    row = scheduler_row("session-control", "kvspec run x", fired)
    assert not row.ok and row.checker == ("iteration 9: Mem Leak Detected! total_tokens=8199",)
    assert row.notes[0].startswith("disagreement: iteration 9: SGLang's checker fired")
    assert row.version == "0.5.10.post1 (real scheduler)"
    assert row.target == "sglang-scheduler"  # its own column beside the memory classes'
    assert scheduler_row("clean", "kvspec run y", outcome()).ok


def test_history_json_is_plain_data():
    """The history's JSON form holds every release with its rows as records."""
    from invariants.targets.sglang_scheduler.history import ReleaseHistory, history_json

    history = ReleaseHistory("0.5.10.post1", specs_run=1)
    history.rows = rows_of(outcome([violation("census.no_orphans", 2, LEAK)]), "s", "r")
    data = history_json([history])
    assert data["releases"][0]["rows"][0]["pages"] == (567,)
    assert json.loads(json.dumps(data, default=str))["releases"][0]["release"] == "0.5.10.post1"
