"""`kvspec report`'s outputs: the pool timeline, the four report files, the exit status, the
worker backends. The report passes on the correct engine, fails — with the replay command
in every file — on a broken one, and gives the same results however its cells are run."""

from __future__ import annotations

import json
import pickle
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from engine.engine import Engine
from engine.mem.req_to_token import ReqToTokenPool
from engine.view import POOL_BUCKETS
from invariants.checking.checker import Level
from invariants.cli import app
from invariants.report.backends import BackendError, run_cells
from invariants.report.cells import ReportCell, memory_report_cells, run_cell
from invariants.report.files import junit_xml
from invariants.report.memory_cells import MemoryCell
from invariants.report.model import CellResult
from invariants.report.run import default_workers, run_report
from invariants.report.svg import VIOLATION_COLOUR, thin
from invariants.report.timeline import Timeline
from invariants.scenarios.matrix import ROOT
from invariants.scenarios.spec import load_spec

SWA_SPEC = ROOT / "specs" / "swa-hybrid.yaml"
FILES = ("report.json", "junit.xml", "report.md", "report.html")


def small_cells() -> list[ReportCell]:
    """One SWA spec (two pools) and one small memory-layer cell."""
    spec = ReportCell("swa-hybrid", "kvspec run specs/swa-hybrid.yaml", spec=load_spec(SWA_SPEC))
    return [spec, *memory_report_cells([MemoryCell(4, num_requests=24)])]


def comparable(result: CellResult) -> dict:
    """A result without its wall time (the only field that may differ between runs)."""
    return replace(result, seconds=0.0).to_dict()


def test_timeline_records_every_pool_at_every_step() -> None:
    """The timeline holds one sample per step event for the full and the SWA pool, and on the
    correct engine the buckets of each sample add up to the pool's capacity."""
    spec = load_spec(SWA_SPEC)
    timeline = Timeline()
    engine = Engine(spec.engine.engine_config(spec.seed), observers=[timeline])
    for i in range(12):
        engine.submit(list(range(1, 40 + i)))
    steps = engine.run_until_idle()
    assert set(timeline.pools) == {"full", "swa"}
    for series in timeline.pools.values():
        assert series.steps == list(range(1, steps + 1))
        totals = [sum(series.buckets[b][i] for b in POOL_BUCKETS) for i in range(steps)]
        assert totals == [series.capacity] * steps
        assert max(series.buckets["request_owned"]) > 0


def test_timeline_is_plain_data() -> None:
    """A recorded timeline survives pickle and a JSON round trip unchanged."""
    result = run_cell(small_cells()[1])
    timeline = result.timeline
    assert max(len(s.steps) for s in timeline.pools.values()) == result.steps > 0
    assert pickle.loads(pickle.dumps(timeline)) == timeline
    assert json.loads(json.dumps(timeline.to_dict())) == timeline.to_dict()


def test_report_passes_and_writes_four_agreeing_files(tmp_path: Path) -> None:
    """On the correct engine: exit 0; the console leads and ends with the verdict (the last
    line says where the files are) around the per-spec summary; report.json, junit.xml,
    report.md and report.html name the same cells, none failed."""
    console = Console(record=True, width=220)
    cells = small_cells()
    assert run_report(console=console, out=tmp_path, cells=cells) == 0
    lines = console.export_text().strip().splitlines()
    assert lines[0] == "PASS · 2/2 cells passed · " + lines[0].split(" · ", 2)[2]
    assert lines[-1].startswith(lines[0]) and lines[-1].endswith(f"files in {tmp_path}/")
    summary = "\n".join(lines)
    assert "first violation" in summary and "swa-hybrid" in summary and "│ memory" in summary
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
    document = json.loads((tmp_path / "report.json").read_text())
    assert [c["name"] for c in document["cells"]] == [c.name for c in cells]
    assert document["summary"]["ok"] and document["header"]["level"] == Level.RECORD
    assert set(document["cells"][0]["timeline"]["pools"]) == {"full", "swa"}
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "0"
    assert [case.get("name") for case in suite.iter("testcase")] == [c.name for c in cells]
    assert "# kvspec report: PASS" in (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    assert html.count("<svg") == 3  # full + SWA pool of the spec, the memory cell's pool
    assert "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # self-contained


def test_row_leak_fails_every_file_with_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mutant that never returns request rows: exit 1; the violation, its replay command and a
    red mark at the failing step appear in the console, junit.xml, report.md and report.html."""
    monkeypatch.setattr(ReqToTokenPool, "free", lambda self, row: None)
    console = Console(record=True, width=300)
    cells = small_cells()
    assert run_report(console=console, out=tmp_path, cells=cells) == 1
    text = console.export_text().strip()
    assert text.startswith("FAIL · 0/2 cells passed") and "FAIL swa-hybrid" in text
    assert "replay: kvspec run specs/swa-hybrid.yaml" in text
    failure = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite/testcase/failure")
    assert failure is not None and failure.get("type") == "InvariantViolation"
    assert "req_pool.conservation" in failure.get("message", "")
    assert "replay: kvspec run specs/swa-hybrid.yaml" in (failure.text or "")
    markdown = (tmp_path / "report.md").read_text()
    assert "# kvspec report: FAIL" in markdown and "## Failures" in markdown
    cell = json.loads((tmp_path / "report.json").read_text())["cells"][0]
    assert cell["num_violations"] > 0 and cell["timeline"]["marks"]
    html = (tmp_path / "report.html").read_text()
    assert 'class="violation"' in html and VIOLATION_COLOUR in html


def test_failing_cells_come_first_in_markdown_and_html() -> None:
    """Failing cells lead the summary table and the plots; passing ones follow in order."""
    from invariants.report.files import report_markdown
    from invariants.report.html import render_html
    from invariants.report.model import ReportHeader, summary

    ok = CellResult("a-ok", "spec", "kvspec run a", 3, 9, 0, (), (), None, 0.1)
    bad = CellResult(
        "b-bad", "spec", "kvspec run b", 3, 9, 0, (), ("finished_reqs >= 4 (got 3)",), None, 0.1
    )
    header = ReportHeader.for_run(1, Level.RECORD, False, 1, None)
    markdown = report_markdown(header, [ok, bad])
    assert markdown.index("b-bad") < markdown.index("a-ok")
    html = render_html(header, [ok, bad], summary([ok, bad]))
    assert html.index("b-bad") < html.index("a-ok")


def test_crash_is_a_junit_error_with_the_replay() -> None:
    """A cell whose engine raised is a JUnit <error> (not a <failure>), counted in errors=."""
    crashed = CellResult(
        "c", "spec", "kvspec run c.yaml", 5, 10, 0, (), (), "SchedulerStall: stuck", 0.1
    )
    from invariants.report.model import ReportHeader

    root = ET.fromstring(
        junit_xml(ReportHeader.for_run(1, Level.RECORD, False, 1, None), [crashed])
    )
    suite = root.find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("failures") == "0"
    error = suite.find("testcase/error")
    assert error is not None and "replay: kvspec run c.yaml" in (error.text or "")


def test_thinning_keeps_the_ends_and_the_limit() -> None:
    """Long runs are thinned to at most the limit, keeping the first and last sample."""
    assert thin(5, 10) == [0, 1, 2, 3, 4]
    index = thin(10_000, 240)
    assert len(index) <= 240 and index[0] == 0 and index[-1] == 9_999


def test_worker_processes_give_the_in_process_results() -> None:
    """Two spawned worker processes return the same results, in cell order, as one process."""
    cells = small_cells()
    seen: list[str] = []
    local = run_cells(cells, Level.RECORD, workers=1)
    pooled = run_cells(cells, Level.RECORD, workers=2, progress=lambda r: seen.append(r.name))
    assert [comparable(r) for r in pooled] == [comparable(r) for r in local]
    assert sorted(seen) == sorted(c.name for c in cells)


def test_ray_backend_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """--ray-address without Ray installed: a clear error naming `kvspec[ray]`."""
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(BackendError, match=r"kvspec\[ray\]"):
        run_cells(small_cells(), Level.RECORD, ray_address="local")


@pytest.mark.slow
def test_ray_backend_gives_the_in_process_results() -> None:
    """On a local Ray instance the cells return the same results, in order, as in-process."""
    ray = pytest.importorskip("ray", reason="Ray is optional: pip install 'kvspec[ray]'")
    cells = small_cells()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_cells(cells, Level.RECORD, ray_address="local")
    finally:
        ray.shutdown()
    assert [comparable(r) for r in remote] == [
        comparable(r) for r in run_cells(cells, Level.RECORD)
    ]


def test_cli_without_ray_exits_2_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`kvspec report --ray-address` without Ray: exit 2 and the install line, before any
    cell runs."""
    monkeypatch.setitem(sys.modules, "ray", None)
    result = CliRunner().invoke(app, ["report", "--out", str(tmp_path), "--ray-address", "local"])
    assert result.exit_code == 2 and "kvspec[ray]" in result.output
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_full_report_passes_on_the_correct_engine(tmp_path: Path) -> None:
    """`make report`: every spec × matrix cell and memory cell passes, and the files are written."""
    console = Console(record=True, width=220)
    assert run_report(console=console, out=tmp_path, workers=default_workers()) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
