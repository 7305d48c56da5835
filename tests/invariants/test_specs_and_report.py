"""Scenario specs, the configuration matrix and the report: specs load or fail with
file:line, the matrix covers every pair of axis values, the report passes on the correct
engine and fails — naming the replay command — on a broken one."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from rich.console import Console

from engine.mem.req_to_token import ReqToTokenPool
from invariants.loader import load_catalog
from invariants.matrix import ROOT, matrix_cells
from invariants.memory_cells import MemoryCell
from invariants.report import default_specs, run_report
from invariants.runner import run_spec
from invariants.spec import SpecError, load_spec, parse_overrides


def test_every_shipped_spec_loads() -> None:
    """Every file under specs/ is a valid spec."""
    for _, path in default_specs():
        assert load_spec(path).name == path.stem


def test_unknown_spec_key_names_file_and_line(tmp_path: Path) -> None:
    """A misspelt engine field is reported as path:line, before anything runs."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: bad\nengine:\n  page_sze: 4\n")
    with pytest.raises(SpecError, match=r"bad\.yaml:4: engine\.page_sze"):
        load_spec(bad)


def test_config_the_engine_rejects_is_a_spec_error(tmp_path: Path) -> None:
    """A value the engine's config rejects (a hybrid pool without a window) names the field."""
    bad = tmp_path / "swa.yaml"
    bad.write_text("version: 1\nname: swa\nengine: {swa_tokens: 64}\n")
    with pytest.raises(SpecError, match="sliding_window"):
        load_spec(bad)


def test_overrides_parse_yaml_scalars() -> None:
    """--set values are YAML scalars; a pair without '=' is an error."""
    assert parse_overrides(["page_size=4", "enable_overlap=false", "cache=chunk"]) == {
        "page_size": 4, "enable_overlap": False, "cache": "chunk"}
    with pytest.raises(SpecError):
        parse_overrides(["page_size"])


def test_pairwise_matrix_covers_every_pair() -> None:
    """Every pair of values of any two axes appears in some matrix cell."""
    cells = [spec.engine for _, spec in matrix_cells()]
    axes = {"page_size": {1, 4, 16, 256}, "cache": {"radix", "chunk"}, "enable_overlap": {True, False},
            "enable_mixed_chunk": {True, False}, "test_retract": {True, False}}
    for (a, va), (b, vb) in itertools.combinations(axes.items(), 2):
        seen = {(getattr(e, a), getattr(e, b)) for e in cells}
        assert seen == set(itertools.product(va, vb)), (a, b)


def test_report_passes_on_the_correct_engine() -> None:
    """`make report` exits 0: no violation, every expect goal met."""
    console = Console(record=True, width=200)
    assert run_report(console=console, memory_cells=[MemoryCell(4)]) == 0
    assert "violations" in console.export_text()


def test_report_fails_and_names_the_replay_on_a_row_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant that never returns request rows fails the report, with the replay command."""
    monkeypatch.setattr(ReqToTokenPool, "free", lambda self, row: None)
    console = Console(record=True, width=300)
    assert run_report(console=console, with_matrix=False, memory_cells=[MemoryCell(1)]) == 1
    text = console.export_text()
    assert "replay with `kvspec run specs/" in text
    assert "req_pool.conservation" in text


def test_spec_run_is_deterministic() -> None:
    """The same spec twice gives the same counters."""
    spec = load_spec(ROOT / "specs" / "retract-mixed-chunk.yaml")
    catalog = load_catalog()
    assert run_spec(spec, catalog).stats == run_spec(spec, catalog).stats
