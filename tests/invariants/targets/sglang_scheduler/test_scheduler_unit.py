"""The kvspec side of the sglang-scheduler target, without sglang: any release's venv runs (its
driver picks the adapter by probing the code), how a moved release and a missing one are said,
how a run's findings are keyed, classified and turned into report rows and history rows."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from invariants.checking.checker import Violation
from invariants.cli import main
from invariants.report.targets import target_row
from invariants.scenarios.ops import Step, Trace
from invariants.targets.driver import AdapterDrift, TargetUnavailable
from invariants.targets.explore import failure_key
from invariants.targets.outcome import EngineFinding, TargetOutcome, TargetStats
from invariants.targets.registry import target
from invariants.targets.sglang_scheduler.history import pages_named, rows_of
from invariants.targets.sglang_scheduler.releases import SchedulerDriver

LEAK = "full: leaked pages (not free, owned by nobody): [567]"
DRIFT = "AttributeError: type object 'Scheduler' has no attribute 'recv_requests'"
BANNER = (
    '{"ready": true, "version": "0.5.23", "adapter": "adapter_context", '
    '"probes": {"launch": "context: no gpu_id"}, "not_applicable": {}, "supports": []}'
)


def outcome(violations=(), sglang=(), error=None) -> TargetOutcome:
    trace = Trace(name="t", ops=[Step(n=3)])
    return TargetOutcome(
        "sglang-scheduler",
        "0.5.10.post1",
        trace,
        TargetStats(steps=30),
        tuple(violations),
        checks=10,
        seconds=0.1,
        error=error,
        findings=tuple(sglang),
        stopped_at=0 if violations else None,
        engine="SGLang",
    )


def violation(invariant: str, step: int, message: str = "m") -> Violation:
    return Violation(invariant, invariant, "step", step, message)


def fake_python(tmp_path: Path, answer: str, banner: str = BANNER) -> Path:
    """An interpreter stand-in: prints a driver's banner (0.5.23's by default), then
    ``answer`` to the first op (the trace's config)."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\necho '{banner}'\nread line\necho '{answer}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_any_release_runs_and_the_banner_names_the_adapter(tmp_path):
    """No release is refused by its version: the driver probes the code and its banner
    names the adapter and each probe's answer, which the driver object keeps."""
    with SchedulerDriver(python=fake_python(tmp_path, "{}")) as driver:
        assert driver.adapter == "adapter_context"
        assert driver.probes == {"launch": "context: no gpu_id"}


@pytest.mark.parametrize("version", ["0.5.11", "0.5.17", "0.5.9"])
def test_a_missing_venv_names_the_make_target(tmp_path, monkeypatch, version):
    """A release whose venv is not built says which make command builds it — any release,
    whether or not one ran before (no list of supported versions refuses it first)."""
    monkeypatch.setattr("invariants.targets.sglang_scheduler.releases.ROOT", tmp_path)
    with pytest.raises(TargetUnavailable, match=rf"make sglang-env SGLANG_VERSION={version}"):
        SchedulerDriver(version)


def test_drift_is_one_line_naming_the_attribute_and_the_adapter(tmp_path, capsys):
    """A release whose internals moved is AdapterDrift naming the error and the adapter
    module; `kvspec run` prints it on one line and exits 2 — never a traceback, never a
    finding."""
    answer = (
        f'{{"error": "{DRIFT}", "drift": true, "where": "adapter_legacy.py:57", "ended": true}}'
    )
    python = fake_python(tmp_path, answer.replace("'", ""))
    with SchedulerDriver(python=python) as driver, pytest.raises(AdapterDrift) as raised:
        driver.ask({"op": "config"})
    assert "recv_requests" in str(raised.value)
    assert "invariants/targets/sglang_scheduler/driver/adapter_context.py" in str(raised.value)
    args = ["run", "specs/matrix-base.yaml", "--target", "sglang-scheduler"]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--target-python", str(python)])
    printed = capsys.readouterr().err
    assert exited.value.code == 2, printed
    assert printed.count("\n") == 1 and printed.startswith("kvspec: adapter drift:")
    assert "Traceback" not in printed


def test_a_probe_that_finds_no_drivable_internal_is_drift_at_startup(tmp_path, capsys):
    """A banner saying drift (a probe met an internal no adapter drives) is AdapterDrift
    naming it and the adapter: `kvspec run` says it on one line, exit 2, before any trace."""
    error = "slot_layout: SessionSlot fields [tokens]: none (adapter: adapter_components)"
    banner = json.dumps(dict(ready=False, drift=True, version="0.5.24", error=error,
                             adapter="adapter_components"))  # fmt: skip
    python = fake_python(tmp_path, "{}", banner)
    with pytest.raises(AdapterDrift, match="SessionSlot fields") as raised:
        SchedulerDriver(python=python)
    assert "driver/adapter_components.py" in str(raised.value)
    args = ["run", "specs/matrix-base.yaml", "--target", "sglang-scheduler"]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--target-python", str(python)])
    printed = capsys.readouterr().err
    assert exited.value.code == 2 and printed.count("\n") == 1, printed
    assert printed.startswith("kvspec: adapter drift:") and "Traceback" not in printed


def test_failure_key_names_every_invariant_of_the_first_failing_view():
    """Explore keys a failure by the kvspec ids of its first failing view (joined by +),
    else SGLang's checker's first words, else liveness, else the refused op's error class."""
    first = [violation("pool.busy_sum", 2), violation("census.no_orphans", 2)]
    later = violation("req.protected_le_committed", 5)
    assert failure_key(outcome([*first, later])) == "pool.busy_sum+census.no_orphans"
    message = "memory leak detected! max_total_num_tokens=256, available_size=154"
    key = failure_key(outcome(sglang=[EngineFinding(1, message)]))
    assert key == "sglang:memory leak detected!"  # counts left out: a shrunk trace leaks less
    assert failure_key(outcome(error="not idle after 200000 steps")) == "liveness"
    refused = outcome(error="op #3 (submit r1): KeyError: 'rid'")
    assert failure_key(refused) == "error:KeyError"
    assert failure_key(outcome()) is None


def test_history_rows_say_which_side_saw_it():
    """A census finding with SGLang silent is ``census`` and names the leaked page; SGLang's
    checker firing at iterations where kvspec held is one ``sglang-false-positive`` row with
    its count; both at one iteration is ``both``."""
    sglang = [EngineFinding(1, "Mem Leak Detected! total_tokens=604"), EngineFinding(3, "again")]
    rows = rows_of(outcome([violation("census.no_orphans", 2, LEAK)], sglang), "s", "replay")
    census, positive = rows
    assert (census.kind, census.invariant, census.iteration, census.pages) == (
        "census",
        "census.no_orphans",
        2,
        (567,),
    )
    assert (positive.kind, positive.iteration, positive.iterations) == (
        "sglang-false-positive",
        1,
        2,
    )
    both = rows_of(outcome([violation("pool.busy_sum", 3)], sglang), "s", "r")[0]
    assert both.kind == "both"
    assert rows_of(outcome(), "s", "r") == []


def test_pages_named_reads_every_page_list_of_the_census():
    """Pages named in census messages (leaked, duplicated) are collected, sorted."""
    named = [violation("a", 1, LEAK), violation("b", 1, "duplicate pages: [3, 9]")]
    assert pages_named(named) == (3, 9, 567)


def test_report_row_fails_on_sglangs_own_checker_alone():
    """On the report, SGLang's own checker firing fails the row even with kvspec clean (the
    disagreement is named in the run's notes, which the row carries)."""
    fired = outcome(sglang=[EngineFinding(9, "Mem Leak Detected! total_tokens=8199")])
    entry, path = target("sglang-scheduler"), Path("specs/session-control.yaml")
    row = target_row(entry, "session-control", path, fired, "--target sglang-scheduler")
    assert not row.ok and row.checker == ("iteration 9: Mem Leak Detected! total_tokens=8199",)
    assert row.version == "0.5.10.post1" and row.steps == 30
    assert row.target == "sglang-scheduler"  # its own column beside the memory classes'
    assert target_row(entry, "clean", path, outcome(), "--target sglang-scheduler").ok


def test_history_json_is_plain_data():
    """The history's JSON form holds every release with its rows as records."""
    from invariants.targets.sglang_scheduler.history import ReleaseHistory, history_json

    history = ReleaseHistory("0.5.10.post1", specs_run=1)
    history.rows = rows_of(outcome([violation("census.no_orphans", 2, LEAK)]), "s", "r")
    data = history_json([history])
    assert data["releases"][0]["rows"][0]["pages"] == (567,)
    assert json.loads(json.dumps(data, default=str))["releases"][0]["release"] == "0.5.10.post1"
