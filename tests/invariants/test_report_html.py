"""report.html in a real headless browser: the page renders offline and shows, for each cell,
the stacked pool plots in the bucket colours and the red violation lines of a failing cell
(the test takes a screenshot and reads its pixels)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from engine.mem.req_to_token import ReqToTokenPool
from invariants.matrix import ROOT
from invariants.memory_cells import MemoryCell
from invariants.report import run_report
from invariants.report_run import ReportCell, memory_report_cells
from invariants.report_svg import COLOURS, VIOLATION_COLOUR
from invariants.spec import load_spec

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                             shutil.which("google-chrome")) if p), None)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--window-size=1200,900")

pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="chromium not installed (apt-get install -y chromium)")


def png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(width, height, RGB pixels) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        header, idat = (body, idat) if kind == b"IHDR" else (header, idat + body if kind == b"IDAT" else idat)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, "unsupported PNG layout"
    step = 3 if colour == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * step, [], bytearray(width * step)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - step] if i >= step else 0
            up, corner = prev[i], prev[i - step] if i >= step else 0
            p = left + up - corner
            nearest = min((abs(p - left), 0, left), (abs(p - up), 1, up), (abs(p - corner), 2, corner))[2]
            line[i] = (line[i] + (0, left, up, (left + up) // 2, nearest)[kind]) & 0xFF
        rows.append(line)
        prev = line
    pixels = [tuple(row[x * step:x * step + 3]) for row in rows for x in range(width)]
    return width, height, pixels  # type: ignore[return-value]


def rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def near(pixel: tuple[int, int, int], target: tuple[int, int, int], tolerance: int = 40) -> bool:
    return sum(abs(a - b) for a, b in zip(pixel, target)) <= tolerance


def screenshot(html: Path, tmp_path: Path) -> Path:
    shot = tmp_path / "report.png"
    command = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
               html.resolve().as_uri()]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return shot


def test_report_html_shows_pool_plots_and_violation_lines(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A report with a failing SWA spec (request rows leak) and a passing memory cell, opened in
    headless Chromium: the screenshot shows every stacked bucket colour in area and the red
    violation lines (far more red than the legend's one swatch)."""
    monkeypatch.setattr(ReqToTokenPool, "free", lambda self, row: None)
    cells = [ReportCell("swa-hybrid", "kvspec run specs/swa-hybrid.yaml",
                        spec=load_spec(ROOT / "specs" / "swa-hybrid.yaml")),
             *memory_report_cells([MemoryCell(4, num_requests=24)])]
    out = tmp_path / "report"
    assert run_report(console=Console(quiet=True), out=out, cells=cells) == 1
    shot = screenshot(out / "report.html", tmp_path)
    width, height, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (1200, 900)
    counts = Counter(pixels)
    for bucket in ("request_owned", "protected", "free"):  # the buckets this run fills
        assert counts[rgb(COLOURS[bucket])] > 2_000, bucket
    red = sum(n for pixel, n in counts.items() if near(pixel, rgb(VIOLATION_COLOUR)))
    assert red > 300
    assert len(counts) > 20  # not a blank page
