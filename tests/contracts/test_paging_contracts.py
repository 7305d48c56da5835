"""CrossHair checks the PEP316 contracts of the pure page math (engine/mem/paging.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_PER_CONDITION = "3"


def crosshair(target: Path) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "crosshair",
        "check",
        "--analysis_kind=PEP316",
        f"--per_condition_timeout={TIMEOUT_PER_CONDITION}",
        str(target),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_paging_contracts_hold() -> None:
    """Every contract of engine/mem/paging.py holds: CrossHair finds no counterexample."""
    result = crosshair(ROOT / "engine" / "mem" / "paging.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_crosshair_finds_planted_power_of_two_alignment_bug() -> None:
    """The bit-trick ceil_align is wrong for page sizes that are not powers of two, and
    CrossHair says so with a concrete counterexample."""
    result = crosshair(Path(__file__).with_name("planted_align.py"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ceil_align_buggy" in result.stdout
    assert "false when calling" in result.stdout
