"""The configuration matrix: ci/matrix.yaml has the issue's axes and declared constraints;
each spec's all-pairs cells cover every valid pair of its axes' values and break no
constraint; the excluded combinations are listed with their reason; a cell's replay command
rebuilds exactly its spec; axis values round-trip through engine fields."""

from __future__ import annotations

import itertools
import shlex

import pytest

from invariants.scenarios.matrix import (
    default_spec_paths,
    excluded_cells,
    report_exclusions,
    spec_axes,
    spec_cells,
)
from invariants.scenarios.matrix_axes import apply_axes, axis_values, load_matrix, violations
from invariants.scenarios.spec import EngineSpec, SpecError, load_spec, parse_overrides

SPECS = [load_spec(p) for p in default_spec_paths()]


def test_matrix_file_has_the_issue_axes_and_reasoned_constraints() -> None:
    """Axes: page_size × attention × speculative × retract × mixed_chunk × overlap × cache;
    every constraint has a reason; eagle_v2 requires overlap."""
    m = load_matrix()
    assert m.axes == {
        "page_size": [1, 4, 16, 256],
        "attention": ["mha", "swa", "mla"],
        "speculative": ["none", "eagle", "eagle_v2"],
        "retract": [False, True],
        "mixed_chunk": [False, True],
        "overlap": [False, True],
        "cache": ["radix", "chunk"],
    }
    assert all(c.reason for c in m.constraints)
    assert violations({"speculative": "eagle_v2", "overlap": False})
    assert not violations({"speculative": "eagle_v2", "overlap": True})


def _full_rows(spec) -> list[dict]:
    axes = spec_axes(spec)
    base = axis_values(spec.engine.model_dump())
    return [
        dict(zip(axes, row))
        for row in itertools.product(*axes.values())
        if not violations({**base, **dict(zip(axes, row))})
    ]


@pytest.mark.parametrize("spec", [s for s in SPECS if len(s.matrix) > 1], ids=lambda s: s.name)
def test_pairwise_cells_cover_every_valid_pair(spec) -> None:
    """Every pair of values of two axes that some valid cell has appears in a pairwise cell."""
    rows = [dict(c.axes) for c in spec_cells(spec)]
    full = _full_rows(spec)
    for a, b in itertools.combinations(spec_axes(spec), 2):
        wanted = {(r[a], r[b]) for r in full}
        assert wanted <= {(r[a], r[b]) for r in rows}, (
            spec.name,
            a,
            b,
            wanted - {(r[a], r[b]) for r in rows},
        )
    assert len(rows) < len(full) or len(full) <= 4


def test_no_cell_breaks_a_constraint_and_exclusions_are_listed() -> None:
    """Cells are valid; the product splits exactly into valid cells and listed exclusions,
    each naming the constraint and its reason."""
    spec = load_spec(next(p for p in default_spec_paths() if p.stem == "matrix-base"))
    full = spec_cells(spec, full=True)
    excluded = excluded_cells(spec)
    assert len(full) + len(excluded) == len(list(itertools.product(*spec_axes(spec).values())))
    for cell in full:
        assert not violations(axis_values(cell.spec.engine.model_dump()))
    assert excluded and all(
        "requires" in str(e) and e.constraint.reason in str(e) for e in excluded
    )


def test_report_lists_every_excluded_cell_with_its_reason() -> None:
    """`kvspec report` lists the cells constraints rule out: per spec and constraint, every
    excluded product cell with the reason — in report.json, report.md and the printed table."""

    from invariants.checking.checker import Level
    from invariants.report.console import exclusion_lines
    from invariants.report.files import report_document, report_markdown
    from invariants.report.model import ReportHeader

    listed = report_exclusions()
    for spec in SPECS:
        cells = sorted(c for x in listed if x.spec == spec.name for c in x.cells)
        assert cells == sorted(e.cell for e in excluded_cells(spec)), spec.name
    base = next(x for x in listed if x.spec == "matrix-base")
    header = ReportHeader.for_run(1, Level.RECORD, False, 1, None)
    document = report_document(header, [], excluded=listed)
    assert sum(x["count"] for x in document["excluded"]) == sum(len(x.cells) for x in listed) > 0
    assert base.to_dict() in document["excluded"]
    markdown = report_markdown(header, [], excluded=listed)
    assert (
        "## Excluded by constraints" in markdown
        and f"| {base.constraint} | {base.reason} |" in markdown
    )
    printed = exclusion_lines(listed)  # the console: one line per constraint, with its count
    assert len(printed) == len({x.constraint for x in listed})
    line = next(p for p in printed if f"`{base.constraint}`" in p)
    counted = sum(len(x.cells) for x in listed if x.constraint == base.constraint)
    assert line.startswith(f"excluded: {counted} cells in ") and base.reason in line


@pytest.mark.parametrize("spec", [s for s in SPECS if s.matrix][:4], ids=lambda s: s.name)
def test_replay_command_rebuilds_the_cell(spec) -> None:
    """`kvspec run SPEC --set axis=value ...` loads the same engine the cell ran."""
    for cell in spec_cells(spec):
        words = shlex.split(cell.replay)
        assert words[:2] == ["kvspec", "run"]
        sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        assert load_spec(words[2], parse_overrides(sets)).engine == cell.spec.engine, cell.replay


def test_axis_values_round_trip_through_engine_fields() -> None:
    """Applying any valid row of axis values to an engine reads back as that row."""
    m = load_matrix()
    base = EngineSpec(max_total_tokens=4096, chunked_prefill_size=64).model_dump()
    for row in itertools.product(*m.axes.values()):
        cell = dict(zip(m.axes, row))
        if violations(cell):
            continue
        fields = apply_axes(base, cell)
        assert axis_values(fields) == cell
        EngineSpec(**fields).engine_config(0)  # the engine accepts it


def test_set_accepts_axis_names_and_rejects_unknown_values(tmp_path) -> None:
    """--set attention=mla / speculative=eagle_v2 work like engine fields; a bad value is an
    error."""
    path = next(p for p in default_spec_paths() if p.stem == "matrix-base")
    spec = load_spec(
        path, parse_overrides(["attention=mla", "speculative=eagle_v2", "page_size=16"])
    )
    assert spec.engine.model == "tiny" and spec.engine.tiny["attention"] == "mla"
    assert spec.engine.speculative == {"version": 2} and spec.engine.page_size == 16
    with pytest.raises(SpecError, match="attention=gqa: not a value"):
        load_spec(path, {"attention": "gqa"})
