"""The `kvspec` CLI: `invariants list`, `invariants lint` (exit codes and `file:line` output)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import kvspec
from typer.testing import CliRunner

from invariants.cli import app

runner = CliRunner()


def test_list_shows_every_invariant() -> None:
    """`kvspec invariants list` prints a table with each id."""
    result = runner.invoke(app, ["invariants", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "pool.busy_sum" in result.output and "tree.idle_unlocked" in result.output


def test_lint_shipped_catalog_exits_zero() -> None:
    """`kvspec invariants lint` on the shipped catalog exits 0 with a one-line summary."""
    result = runner.invoke(app, ["invariants", "lint"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ok: ") and result.output.count("\n") == 1


def test_lint_broken_file_exits_one_with_file_line(tmp_path: Path) -> None:
    """Linting a broken file exits 1 and prints `path:line: [id] reason`."""
    path = tmp_path / "broken.yaml"
    path.write_text(
        "version: 1\ninvariants:\n  - id: t.bad\n    title: x\n    when: [step]\n"
        "    expr: reqs.pop()\n    message: m\n    fixtures:\n"
        "      pass: {event: step, view: {}}\n      fail: {event: step, view: {}}\n"
    )
    result = runner.invoke(app, ["invariants", "lint", str(path)])
    assert result.exit_code == 1
    assert f"{path}:6: [t.bad] expr: col 1: call to method '.pop' is not allowed" in result.output


def test_list_broken_file_exits_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`list` on a broken file prints the load error in one line and exits 2 (a user's
    mistake, not a finding)."""
    path = tmp_path / "broken.yaml"
    path.write_text("version: 1\ninvariants: [\n")
    result = kvspec(capsys, monkeypatch, "invariants", "list", str(path))
    assert result.code == 2
    assert result.err.startswith(f"kvspec: {path}:3: [?] YAML:") and result.err.count("\n") == 1
