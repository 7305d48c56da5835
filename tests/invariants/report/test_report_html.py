"""report.html in a real headless browser, 1400 and 800 px wide: the page renders offline and
shows a failing cell (open, first) with its stacked pool plots in the bucket colours and red
violation lines, passing cells folded; the filter box, driven by the address, hides the rows
and sections that do not match (the test reads the screenshot's pixels and the live DOM)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from engine.mem.req_to_token import ReqToTokenPool
from invariants.checking.checker import Level
from invariants.checking.loader import shipped_catalog
from invariants.report.cells import ReportCell, memory_report_cells, run_cell
from invariants.report.files import write_report
from invariants.report.memory_cells import MemoryCell
from invariants.report.model import ReportHeader
from invariants.report.svg import COLOURS, VIOLATION_COLOUR
from invariants.scenarios.matrix import ROOT
from invariants.scenarios.spec import load_spec

CHROMIUM = next(
    (
        p
        for p in (
            shutil.which("chromium"),
            shutil.which("chromium-browser"),
            shutil.which("google-chrome"),
        )
        if p
    ),
    None,
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)

HEIGHT = 1400  # at 800 px the findings push the first plots down

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)"
)


def rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def near(pixel: tuple[int, int, int], target: tuple[int, int, int], tolerance: int = 40) -> bool:
    return sum(abs(a - b) for a, b in zip(pixel, target)) <= tolerance


def screenshot(html: Path, tmp_path: Path, width: int) -> Path:
    shot = tmp_path / f"report-{width}.png"
    command = [
        CHROMIUM,
        *FLAGS,
        f"--window-size={width},{HEIGHT}",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        html.resolve().as_uri(),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return shot


def live_dom(html: Path, tmp_path: Path, fragment: str) -> str:
    """The DOM after the page's script ran, opened at ``#fragment``."""
    command = [
        CHROMIUM,
        *FLAGS,
        f"--user-data-dir={tmp_path / 'profile'}",
        "--dump-dom",
        f"{html.resolve().as_uri()}#{fragment}",
    ]
    done = subprocess.run(command, check=True, capture_output=True, timeout=120, text=True)
    return done.stdout


@pytest.fixture(scope="module")
def failing_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report of a failing SWA spec (its request rows leak) and a passing memory cell."""
    out = tmp_path_factory.mktemp("html") / "report"
    swa = ReportCell(
        "swa-hybrid",
        "kvspec run specs/swa-hybrid.yaml",
        spec=load_spec(ROOT / "specs" / "swa-hybrid.yaml"),
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ReqToTokenPool, "free", lambda self, row: None)
        failed = run_cell(swa)
    passed = run_cell(memory_report_cells([MemoryCell(4, num_requests=24)])[0])
    assert not failed.ok and passed.ok
    header = ReportHeader.for_run(len(shipped_catalog()), Level.RECORD, False, 1, None)
    write_report(out, header, [passed, failed], None, [])
    return out / "report.html"


@pytest.mark.parametrize("width", [1400, 800])
def test_report_html_shows_pool_plots_and_violation_lines(
    failing_report: Path, tmp_path: Path, width: int
) -> None:
    """Opened in headless Chromium at 1400 and 800 px, the failing cell comes first and open:
    the screenshot shows its stacked bucket colours in area and the red violation lines (far
    more red than the legend's one swatch)."""
    shot = screenshot(failing_report, tmp_path, width)
    with Image.open(shot) as image:
        assert image.format == "PNG" and image.size == (width, HEIGHT)
        counts = Counter({c: n for n, c in image.convert("RGB").getcolors(width * HEIGHT)})
    for bucket in ("request_owned", "protected", "free"):  # the buckets this run fills
        assert counts[rgb(COLOURS[bucket])] > 2_000, bucket
    red = sum(n for pixel, n in counts.items() if near(pixel, rgb(VIOLATION_COLOUR)))
    assert red > 300
    assert len(counts) > 20  # not a blank page


def test_the_filter_hides_what_does_not_match(failing_report: Path, tmp_path: Path) -> None:
    """``#q=words&status=…`` filters on load as typing does: rows and cell sections whose name
    lacks a word, or whose status differs, are hidden; a passing cell is folded."""
    dom = live_dom(failing_report, tmp_path, "q=memory%20ps4")
    assert re.search(r'<tr class="failed" data-name="swa-hybrid"[^>]*hidden', dom)
    assert re.search(r'<tr class="ok" data-name="memory ps4-radix seed 0"[^>]*">', dom)
    assert re.search(r'<details class="cell"[^>]*data-name="swa-hybrid"[^>]*hidden', dom)
    assert "1 cells shown" in dom
    dom = live_dom(failing_report, tmp_path, "status=failed")
    assert re.search(r'<tr class="ok"[^>]*hidden', dom) and "1 cells shown" in dom
    passing_section = re.search(r'<details class="cell"[^>]*data-status="passed"[^>]*>', dom)
    assert passing_section is not None and " open" not in passing_section.group(0)
