"""`kvspec report --target NAME[,NAME…]` without a real engine: which kvspec cells each choice
runs, how a target's rows pair with them, what fails the report (a violation or a crash on a
real target) and what does not (an unmet goal there, an unsupported spec), the files'
side-by-side section (report.json's ``targets``, and 0.x's ``sglang`` key one release more),
and exit 2 when a target's interpreter is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

import invariants.report.run as report_module
from invariants.cli import main
from invariants.report.cells import ReportCell
from invariants.report.model import CellResult, TargetRow
from invariants.report.run import _target_cells, run_report
from invariants.report.target_view import target_markdown
from invariants.report.targets import (
    GOALS_NOTE,
    chosen_targets,
    row_text,
    side_by_side,
    verdict,
)
from invariants.scenarios.matrix import ROOT

SMALL = [
    ("chunked-prefill-paged", ROOT / "specs" / "chunked-prefill-paged.yaml"),
    ("swa-hybrid", ROOT / "specs" / "swa-hybrid.yaml"),
]
VIOLATION = {
    "invariant": "pool.busy_sum",
    "step": 7,
    "event": "step",
    "message": "free + busy != capacity",
}


def cell(name: str, **fields) -> CellResult:
    base = {
        "name": name,
        "kind": "spec",
        "replay": f"kvspec run specs/{name}.yaml",
        "steps": 10,
        "checks": 100,
        "num_violations": 0,
        "violations": (),
        "unmet": (),
        "error": None,
        "seconds": 0.1,
    }
    return CellResult(**{**base, **fields})


def row(name: str, **fields) -> TargetRow:
    base = {
        "name": name,
        "replay": f"kvspec run specs/{name}.yaml --target sglang",
        "steps": 8,
        "checks": 90,
        "version": "0.5.23",
        "target": "sglang",
    }
    return TargetRow(**{**base, **fields})


def test_each_target_runs_its_own_kvspec_cells():
    """Real targets alone: each spec as written; with kvspec among them: the report's cells
    plus each spec as written that is not already one of them (by name); kvspec alone: the
    report's cells as before."""
    own = [
        ReportCell("chunked-prefill-paged", "kvspec run specs/chunked-prefill-paged.yaml"),
        ReportCell("swa-hybrid ps1 mha", "kvspec run specs/swa-hybrid.yaml --set page_size=1"),
    ]
    as_written = _target_cells(None, True, SMALL, False, False, None)
    assert [(c.name, c.spec.name) for c in as_written] == [
        ("chunked-prefill-paged", "chunked-prefill-paged"),
        ("swa-hybrid", "swa-hybrid"),
    ]
    both = [c.name for c in _target_cells(own, False, SMALL, False, True, None)]
    assert both == ["chunked-prefill-paged", "swa-hybrid ps1 mha", "swa-hybrid"]
    assert _target_cells(own, False, [], False, True, None) == own


def test_target_choices_come_from_the_registry():
    """--target names kvspec and the registry's targets, comma-separated; ``all`` is every
    real engine, ``both`` (0.x's name) kvspec and sglang; anything else is refused naming the
    choices."""
    assert chosen_targets("all") == ("sglang", "sglang-scheduler", "sglang-server", "vllm")
    assert chosen_targets("both") == ("kvspec", "sglang")
    assert chosen_targets("kvspec, vllm") == ("kvspec", "vllm")
    choices = "choose from kvspec, sglang, sglang-scheduler, sglang-server, vllm"
    with pytest.raises(ValueError, match=choices):
        chosen_targets("trtllm")


def test_rows_pair_by_spec_name_and_say_why_a_spec_is_unsupported():
    """Each sglang row sits beside the kvspec cell of the same name; an unsupported spec
    shows its reason instead of counts; a spec no kvspec cell ran says so."""
    pairs = side_by_side(
        [cell("a", steps=12), cell("b")],
        [row("a", unmet=("finished_reqs >= 40 (got 38)",)), row("c", unsupported="model: tiny")],
    )
    assert [(p.name, p.kvspec and p.kvspec.steps) for p in pairs] == [("a", 12), ("c", None)]
    assert row_text(pairs[0].row) == "8 / 0 / 1 unmet"
    assert row_text(pairs[1].row) == "unsupported: model: tiny"


def test_violations_and_crashes_fail_unmet_goals_and_unsupported_do_not():
    """On the sglang target a violation or a crash fails its row; an unmet goal (tuned on
    kvspec's schedule) or an unsupported spec is shown and passes."""
    assert not row("a", num_violations=1, violations=(VIOLATION,)).ok
    assert not row("a", error="sglang driver died").ok
    assert (
        row("a", unmet=("aborted_reqs >= 20 (got 19)",)).ok
        and row("a", unsupported="speculative").ok
    )
    totals = {"ok": True, "failed": 0, "cells": 2}
    pairs = side_by_side([cell("a")], [row("a", num_violations=1, violations=(VIOLATION,))])
    assert verdict(totals, pairs) == "FAIL — 0 of 2 cells, 1 of 1 sglang rows"
    assert verdict(totals, None) == "PASS"


def test_markdown_section_lists_every_pair_and_each_failure_with_its_replay():
    """report.md's section: the note on goals, one line per spec, and a failing row's
    violation and replay command."""
    pairs = side_by_side(
        [cell("a")],
        [row("a", num_violations=1, violations=(VIOLATION,)), row("b", unsupported="flush_cache")],
    )
    text = "\n".join(target_markdown(pairs))
    assert (
        GOALS_NOTE.capitalize() in text
        and "| ➖ | b |" in text
        and "unsupported: flush_cache" in text
    )
    assert (
        "[pool.busy_sum] step 7" in text
        and "replay: kvspec run specs/a.yaml --target sglang" in text
    )


@pytest.mark.parametrize(
    "rows, code",
    [
        (
            [
                row("chunked-prefill-paged", unmet=("finished_reqs >= 99 (got 3)",)),
                row("swa-hybrid", unsupported="x"),
            ],
            0,
        ),
        (
            [
                row("chunked-prefill-paged"),
                row("swa-hybrid", num_violations=1, violations=(VIOLATION,)),
            ],
            1,
        ),
        ([row("chunked-prefill-paged", error="op #3 (step): KeyError"), row("swa-hybrid")], 1),
    ],
)
def test_report_exit_status_and_files_with_the_sglang_rows(monkeypatch, tmp_path: Path, rows, code):
    """run_report(target="sglang") runs each spec as written on kvspec, pairs the sglang rows
    (stubbed here) with them, exits 1 only on an sglang violation or crash, and writes the
    pairs into report.json (``targets``, and 0.x's ``sglang``), report.md and report.html."""
    monkeypatch.setattr(report_module, "target_rows", lambda *a, **k: rows)
    console = Console(record=True, width=250)
    assert run_report(console=console, out=tmp_path, target="sglang", specs=SMALL) == code
    document = json.loads((tmp_path / "report.json").read_text())
    assert [c["name"] for c in document["cells"]] == ["chunked-prefill-paged", "swa-hybrid"]
    side = document["targets"]["sglang"]["side_by_side"]
    assert [p["spec"] for p in side] == ["chunked-prefill-paged", "swa-hybrid"]
    assert document["targets"]["sglang"]["summary"]["ok"] is (code == 0)
    legacy = document["sglang"]  # 0.x's key, one release more
    assert [p["sglang_row"] for p in legacy["side_by_side"]] == [p["row"] for p in side]
    assert "side by side" in (tmp_path / "report.md").read_text()
    assert "side by side" in (tmp_path / "report.html").read_text()
    assert "kvspec: steps / violations / goals" in console.export_text()


def test_missing_sglang_interpreter_exits_2_with_the_reason(tmp_path: Path, capsys):
    """`kvspec report --target kvspec,sglang` without an sglang python exits 2 and says how
    to get one, in one line, before any cell runs."""
    missing = str(tmp_path / "none" / "python")
    args = ["report", "--target", "both", "--out", str(tmp_path), "--target-python", missing]
    with pytest.raises(SystemExit) as exited:
        main(args)
    printed = capsys.readouterr().err
    assert exited.value.code == 2 and "make sglang-env" in printed and printed.count("\n") == 1
    assert not (tmp_path / "report.json").exists()


def test_a_target_runs_lines_say_why_and_replay(capsys: pytest.CaptureFixture[str]) -> None:
    """`kvspec run --target NAME` and a target's own run command print one way: an
    unsupported spec says why (exit 2 by the caller), a finding ends with its replay, an
    unmet goal is a note (goals were tuned on kvspec's schedule), not a failure."""
    from invariants.targets.outcome import TargetOutcome, TargetStats, unsupported_outcome
    from invariants.targets.text import outcome_lines, unsupported_line

    refused = unsupported_outcome("sglang", None, ["speculative decoding"])
    assert unsupported_line("a", refused) == (
        "a: not supported by the sglang target: speculative decoding"
    )
    unmet = TargetOutcome(
        "sglang", "0.5.23", None, TargetStats(steps=3), checks=5, unmet=("finished >= 2 (got 1)",)
    )
    lines = outcome_lines("a", unmet, "kvspec run a.yaml --target sglang")
    assert unmet.ok and "note: expected finished >= 2 (got 1)" in lines[-1]
    assert lines[0] == "a on SGLang 0.5.23 (memory classes): steps=3"
    crashed = TargetOutcome("sglang", "0.5.23", None, TargetStats(steps=3), error="op #1: boom")
    assert outcome_lines("a", crashed, "kvspec run a.yaml")[-1] == "replay: kvspec run a.yaml"


def test_all_targets_give_one_overview_then_each_targets_section(monkeypatch, tmp_path: Path):
    """run_report(target="all") runs each spec as written on kvspec and on every real-engine
    target (stubbed here), prints one overview row per spec with a column per target
    (an unsupported spec says why), then each target's own table; a violation on any target
    fails the report, named with its target; report.json holds one part per target."""

    def rows(target: str, **chunked: object) -> list[TargetRow]:
        return [
            row("chunked-prefill-paged", target=target, **chunked),
            row("swa-hybrid", target=target, unsupported="SWA pools (swa_tokens)")
            if target == "vllm"
            else row("swa-hybrid", target=target),
        ]

    failing = {"num_violations": 1, "violations": (VIOLATION,)}
    stubbed = {
        "sglang": rows("sglang"),
        "sglang-scheduler": rows("sglang-scheduler"),
        "sglang-server": rows("sglang-server"),
        "vllm": rows("vllm", **failing),
    }
    monkeypatch.setattr(report_module, "target_rows", lambda entry, *a, **k: stubbed[entry.name])
    console = Console(record=True, width=250)
    assert run_report(console=console, out=tmp_path, target="all", specs=SMALL) == 1
    text = console.export_text()
    assert "kvspec and every real-engine target" in text
    header = next(
        line for line in text.splitlines() if "sglang-scheduler" in line and "spec" in line
    )
    assert header.index("kvspec") < header.index("sglang") < header.index("vllm")
    assert "unsupported: SWA pools (swa_tokens)" in text
    assert "chunked-prefill-paged on vllm" in text  # the failure, with its target
    assert "1 real-engine rows failed" in text
    parts = json.loads((tmp_path / "report.json").read_text())["targets"]
    assert list(parts) == ["sglang", "sglang-scheduler", "sglang-server", "vllm"]
    assert parts["vllm"]["summary"]["failed"] == 1 and parts["sglang"]["summary"]["ok"]
    markdown = (tmp_path / "report.md").read_text()
    assert "| spec | kvspec | sglang | sglang-scheduler | sglang-server | vllm |" in markdown
    assert "❌ " in markdown and "➖ unsupported: SWA pools" in markdown
