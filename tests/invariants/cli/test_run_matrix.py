"""`kvspec run SPEC --matrix`: the spec's matrix cells, filtered by `--set AXIS=VALUE`, each
checked — exactly the cells whose axis values match, one line each; a failing cell prints
its replay command and fails the run; a filter on something that is not an axis, or one no
cell matches, is a usage error (exit 2)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from engine.mem.req_to_token import ReqToTokenPool
from invariants.cli import app
from invariants.scenarios.matrix import spec_cells
from invariants.scenarios.matrix_axes import axis_values
from invariants.scenarios.spec import load_spec

SPEC = "specs/abort-storm.yaml"


def _invoke(*args: str):
    return CliRunner().invoke(app, ["run", SPEC, "--matrix", *args])


def test_filter_runs_exactly_the_matching_cells() -> None:
    """--set page_size=16 runs every pairwise cell at page size 16 and no other."""
    expected = [
        c.name
        for c in spec_cells(load_spec(SPEC))
        if axis_values(c.spec.engine.model_dump())["page_size"] == 16
    ]
    result = _invoke("--set", "page_size=16")
    assert result.exit_code == 0, result.output
    ran = [
        line.split(": ")[0].split(None, 1)[1]
        for line in result.output.splitlines()
        if line.startswith("ok ")
    ]
    assert expected and ran == expected
    assert f"{len(expected)}/{len(expected)} cells passed" in result.output


def test_a_failing_cell_prints_its_replay_and_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """With request rows that never come back, the cells fail: exit 1, replay commands shown."""
    monkeypatch.setattr(ReqToTokenPool, "free", lambda self, row: None)
    result = _invoke("--set", "page_size=16", "--set", "speculative=none")
    assert result.exit_code == 1
    assert (
        "FAILED" in result.output
        and f"replay: kvspec run {SPEC} --set page_size=16" in result.output
    )


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["pagesize=16"], "not an axis: pagesize"),
        (["page_size=3"], "no matrix cell matches page_size=3"),
    ],
)
def test_bad_filters_are_usage_errors(sets: list[str], message: str) -> None:
    """A filter that is not an axis, or that no cell matches, exits 2 and says why."""
    result = _invoke(*[arg for s in sets for arg in ("--set", s)])
    assert result.exit_code == 2 and message in result.output
