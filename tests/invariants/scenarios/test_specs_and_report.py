"""Scenario specs and the configuration matrix: specs load or fail with file:line, the
matrix covers every pair of axis values. (The report itself: tests/invariants/report/.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from invariants.checking.loader import load_catalog
from invariants.scenarios.matrix import ROOT, default_spec_paths
from invariants.scenarios.runner import run_spec
from invariants.scenarios.spec import SpecError, load_spec, parse_overrides


def test_every_shipped_spec_loads() -> None:
    """Every file under specs/ (not the bug zoo) is a valid spec named after its file."""
    for path in default_spec_paths():
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
        "page_size": 4,
        "enable_overlap": False,
        "cache": "chunk",
    }
    with pytest.raises(SpecError):
        parse_overrides(["page_size"])


def test_spec_run_is_deterministic() -> None:
    """The same spec twice gives the same counters."""
    spec = load_spec(ROOT / "specs" / "retract-mixed-chunk.yaml")
    catalog = load_catalog()
    assert run_spec(spec, catalog).stats == run_spec(spec, catalog).stats
