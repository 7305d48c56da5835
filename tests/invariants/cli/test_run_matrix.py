"""`kvspec run SPEC --matrix`: the spec's matrix cells, filtered by `--set AXIS=VALUE`, each
checked — exactly the cells whose axis values match, one row each; a failing cell prints
its replay command and fails the run; a filter on something that is not an axis, or one no
cell matches, is a usage error (one line, exit 2)."""

from __future__ import annotations

import pytest
from cli_support import Ran, kvspec

from engine.mem.req_to_token import ReqToTokenPool
from invariants.scenarios.matrix import spec_cells
from invariants.scenarios.matrix_axes import axis_values
from invariants.scenarios.spec import load_spec

SPEC = "specs/abort-storm.yaml"


@pytest.fixture
def run_matrix(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    def run(*args: str) -> Ran:
        return kvspec(capsys, monkeypatch, "run", SPEC, "--matrix", *args)

    return run


def test_filter_runs_exactly_the_matching_cells(run_matrix) -> None:
    """--set page_size=16 runs every pairwise cell at page size 16 and no other (one
    tab-separated row each with --format plain), then the verdict line."""
    expected = [
        c.name
        for c in spec_cells(load_spec(SPEC))
        if axis_values(c.spec.engine.model_dump())["page_size"] == 16
    ]
    result = run_matrix("--set", "page_size=16", "--format", "plain")
    assert result.code == 0, result.out
    lines = result.out.splitlines()
    assert lines[0].split("\t")[:2] == ["cell", "steps"]
    ran = [line.split("\t")[0] for line in lines[1:] if "\t" in line]
    assert expected and ran == expected
    assert lines[-1].startswith(f"PASS · {len(expected)}/{len(expected)} cells passed")


def test_a_failing_cell_prints_its_replay_and_fails(
    run_matrix, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With request rows that never come back, the cells fail: exit 1, replay commands shown,
    the last line a FAIL verdict."""
    monkeypatch.setattr(ReqToTokenPool, "free", lambda self, row: None)
    result = run_matrix("--set", "page_size=16", "--set", "speculative=none")
    assert result.code == 1
    assert "FAIL " in result.out and f"replay: kvspec run {SPEC} --set page_size=16" in result.out
    assert result.out.splitlines()[-1].startswith("FAIL · 0/")


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["pagesize=16"], "not an axis: pagesize"),
        (["page_size=3"], "no matrix cell matches page_size=3"),
    ],
)
def test_bad_filters_are_usage_errors(run_matrix, sets: list[str], message: str) -> None:
    """A filter that is not an axis, or that no cell matches, exits 2 and says why."""
    result = run_matrix(*[arg for s in sets for arg in ("--set", s)])
    assert result.code == 2 and message in result.err and result.err.count("\n") == 1
