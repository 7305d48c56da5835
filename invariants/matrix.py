"""The configuration matrix (ci/matrix.yaml): one base spec × axes, combined pairwise
(allpairspy) or as a full product.

Keeps: every cell is a valid spec named after its axis values, so a failing cell replays
with `kvspec run BASE --set axis=value ...`.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Literal

from allpairspy import AllPairs
from pydantic import BaseModel, ConfigDict

from invariants.loader import read_yaml
from invariants.spec import Spec, load_spec

ROOT = Path(__file__).resolve().parents[1]


class MatrixSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    base: str
    combine: Literal["pairwise", "product"] = "pairwise"
    axes: dict[str, list[Any]]


def engine_overrides(cell: dict[str, Any], base: Spec) -> dict[str, Any]:
    """Axis values as engine fields; `swa: true` gives a same-sized SWA pool and a window;
    `eagle: true` EAGLE of the version the cell's scheduler takes (v2 with overlap, v1 without)."""
    fields = {k: v for k, v in cell.items() if k not in ("swa", "eagle")}
    if cell.get("swa"):
        fields |= {"swa_tokens": base.engine.max_total_tokens, "sliding_window": 64}
    if cell.get("eagle"):
        overlap = fields.get("enable_overlap", base.engine.enable_overlap)
        fields["speculative"] = {"version": 2 if overlap else 1}
    return fields


def matrix_cells(path: str | Path = ROOT / "ci" / "matrix.yaml",
                 combine: str | None = None) -> list[tuple[str, Spec]]:
    """(cell name, spec) for every combination the matrix asks for."""
    matrix = MatrixSpec.model_validate(dict(read_yaml(Path(path).read_text())))
    names, values = list(matrix.axes), list(matrix.axes.values())
    if (combine or matrix.combine) == "product":
        rows = list(itertools.product(*values))
    else:
        rows = [tuple(row) for row in AllPairs(values)]
    base_path = ROOT / matrix.base
    base = load_spec(base_path)
    cells = []
    for row in rows:
        cell = dict(zip(names, row))
        name = " ".join(_short(k, v) for k, v in cell.items())
        cells.append((name, load_spec(base_path, engine_overrides(cell, base))))
    return cells


AXIS_NAMES = {"page_size": "ps", "enable_overlap": "overlap", "enable_mixed_chunk": "mixed",
              "test_retract": "retract"}


def _short(axis: str, value: Any) -> str:
    """A compact cell label part: ``ps16``, ``chunk``, ``overlap+``, ``swa-``."""
    name = AXIS_NAMES.get(axis, axis)
    if isinstance(value, bool):
        return f"{name}{'+' if value else '-'}"
    return str(value) if axis == "cache" else f"{name}{value}"
