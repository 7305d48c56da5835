"""report.html in a real headless browser: the page renders offline and shows, for each cell,
the stacked pool plots in the bucket colours and the red violation lines of a failing cell
(the test takes a screenshot and reads its pixels)."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console

from engine.mem.req_to_token import ReqToTokenPool
from invariants.report.cells import ReportCell, memory_report_cells
from invariants.report.memory_cells import MemoryCell
from invariants.report.run import run_report
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
    "--window-size=1200,900",
)

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)"
)


def rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def near(pixel: tuple[int, int, int], target: tuple[int, int, int], tolerance: int = 40) -> bool:
    return sum(abs(a - b) for a, b in zip(pixel, target)) <= tolerance


def screenshot(html: Path, tmp_path: Path) -> Path:
    shot = tmp_path / "report.png"
    command = [
        CHROMIUM,
        *FLAGS,
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        html.resolve().as_uri(),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return shot


def test_report_html_shows_pool_plots_and_violation_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report with a failing SWA spec (request rows leak) and a passing memory cell, opened in
    headless Chromium: the screenshot shows every stacked bucket colour in area and the red
    violation lines (far more red than the legend's one swatch)."""
    monkeypatch.setattr(ReqToTokenPool, "free", lambda self, row: None)
    cells = [
        ReportCell(
            "swa-hybrid",
            "kvspec run specs/swa-hybrid.yaml",
            spec=load_spec(ROOT / "specs" / "swa-hybrid.yaml"),
        ),
        *memory_report_cells([MemoryCell(4, num_requests=24)]),
    ]
    out = tmp_path / "report"
    assert run_report(console=Console(quiet=True), out=out, cells=cells) == 1
    shot = screenshot(out / "report.html", tmp_path)
    with Image.open(shot) as image:
        assert image.format == "PNG" and image.size == (1200, 900)
        counts = Counter({colour: n for n, colour in image.convert("RGB").getcolors(1200 * 900)})
    for bucket in ("request_owned", "protected", "free"):  # the buckets this run fills
        assert counts[rgb(COLOURS[bucket])] > 2_000, bucket
    red = sum(n for pixel, n in counts.items() if near(pixel, rgb(VIOLATION_COLOUR)))
    assert red > 300
    assert len(counts) > 20  # not a blank page
