"""`kvspec report --target kvspec,sglang` on real SGLang (two specs, to stay fast): each spec as
written runs on both targets and the report shows them side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from invariants.report.run import run_report
from invariants.scenarios.matrix import ROOT

pytestmark = pytest.mark.sglang
SPECS = [
    ("session-timeouts", ROOT / "specs" / "session-timeouts.yaml"),
    ("swa-hybrid", ROOT / "specs" / "swa-hybrid.yaml"),
]


def test_report_shows_both_targets_side_by_side(tmp_path: Path, driver):
    """swa-hybrid runs on kvspec and on SGLang 0.5.23 with every invariant holding;
    session-timeouts (flush_cache) is shown unsupported with the reason, not failed; the
    printed output and report.json carry both targets' steps, violations and goals."""
    console = Console(record=True, width=250)
    code = run_report(
        console=console, out=tmp_path, target="kvspec,sglang", cells=[], specs=SPECS, driver=driver
    )
    printed = console.export_text()
    document = json.loads((tmp_path / "report.json").read_text())
    assert code == 0, printed
    assert [c["name"] for c in document["cells"]] == ["session-timeouts", "swa-hybrid"]
    unsupported, swa = (p["row"] for p in document["targets"]["sglang"]["side_by_side"])
    legacy = document["sglang"]["side_by_side"]  # 0.x's key, one release more
    assert [p["sglang_row"] for p in legacy] == [unsupported, swa]
    assert "flush_cache" in unsupported["unsupported"] and unsupported["steps"] == 0
    assert swa["version"] == "0.5.23" and swa["steps"] > 100 and swa["checks"] > 1000
    assert swa["num_violations"] == 0 and swa["error"] is None
    assert "kvspec report" in printed and "SGLang 0.5.23 (memory classes) side by" in printed
    assert "unsupported: flush_cache" in printed
