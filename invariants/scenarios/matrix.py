"""The configuration matrix: every scenario spec × the axes its ``matrix:`` names (values from
ci/matrix.yaml), combined all-pairs (allpairspy, the PR tier) or as the full product
(``--full``), with the declared constraints filtered out — and listed by the report
(``report_exclusions``), never silently skipped.

Keeps: every cell is a valid spec named after its axis values, and its ``replay`` is the
exact command that reruns it (``kvspec run SPEC --set axis=value ...``); constraints are
evaluated on the cell's axis values together with the spec's own values on the axes it does
not vary, so all-pairs coverage is complete over the valid pairs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allpairspy import AllPairs

from invariants.scenarios.matrix_axes import (
    ROOT,
    Constraint,
    axis_label,
    axis_values,
    load_matrix,
    violations,
)
from invariants.scenarios.spec import Spec, load_spec

SPEC_DIR = ROOT / "specs"
SHORT = {"page_size": "ps", "retract": "retract", "mixed_chunk": "mixed", "overlap": "overlap"}


@dataclass(frozen=True, slots=True)
class Cell:
    """One run of the matrix: a name, the spec with the cell's axes applied, its replay."""

    name: str
    spec: Spec
    replay: str
    axes: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Excluded:
    """A combination a declared constraint rules out (the product's rows, by name)."""

    spec: str
    row: tuple[tuple[str, Any], ...]
    constraint: Constraint

    @property
    def cell(self) -> str:
        """The row as ``axis=value ...``."""
        return " ".join(f"{k}={axis_label(v)}" for k, v in self.row)

    def __str__(self) -> str:
        return f"{self.spec}: {self.cell} — {self.constraint.label()}: {self.constraint.reason}"


@dataclass(frozen=True, slots=True)
class Exclusion:
    """The product cells of one spec that one declared constraint rules out (as the report
    lists them: the constraint, its reason, every cell)."""

    spec: str
    constraint: str  # its label: ``speculative=eagle requires overlap=off``
    reason: str
    cells: tuple[str, ...]  # each as ``axis=value ...``

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "constraint": self.constraint,
            "reason": self.reason,
            "count": len(self.cells),
            "cells": list(self.cells),
        }


def spec_axes(spec: Spec) -> dict[str, list[Any]]:
    """The axes ``spec`` varies, each with its values (``all``: every value of the axis)."""
    known = load_matrix().axes
    return {
        axis: list(known[axis]) if values == "all" else list(values)
        for axis, values in spec.matrix.items()
    }


def _base_values(spec: Spec) -> dict[str, Any]:
    return axis_values(spec.engine.model_dump())


def _rows(spec: Spec, full: bool) -> list[dict[str, Any]]:
    axes, base = spec_axes(spec), _base_values(spec)
    names = list(axes)
    if not names:
        return [{}]

    def valid(values: list[Any]) -> bool:
        return not violations({**base, **dict(zip(names, values))})

    product = [row for row in itertools.product(*axes.values()) if valid(list(row))]
    if full or len(names) == 1:
        return [dict(zip(names, row)) for row in product]
    rows = [tuple(row) for row in AllPairs(list(axes.values()), filter_func=valid)]
    return [dict(zip(names, row)) for row in rows + _top_up(rows, product)]


def _pairs(row: tuple[Any, ...]) -> set[tuple[int, Any, int, Any]]:
    return {(i, row[i], j, row[j]) for i, j in itertools.combinations(range(len(row)), 2)}


def _top_up(rows: list[tuple[Any, ...]], product: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Valid rows covering the valid pairs that allpairspy's filtered search left out (with a
    ``filter_func`` it can give up on a pair); greedy: the row covering most, first."""
    missing = set().union(*map(_pairs, product)) - set().union(set(), *map(_pairs, rows))
    extra = []
    while missing:
        best = max(product, key=lambda row: len(_pairs(row) & missing))
        extra.append(best)
        missing -= _pairs(best)
    return extra


def relative(path: str | Path) -> str:
    """``path`` relative to the repository (as a replay command names it); as given when it
    lies outside."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)


def spec_cells(spec: Spec, full: bool = False) -> list[Cell]:
    """The cells of one spec: all-pairs over its axes (``full``: the product), valid only."""
    path = relative(spec.path)
    cells = []
    for row in _rows(spec, full):
        sets = " ".join(f"--set {k}={axis_label(v)}" for k, v in row.items())
        label = " ".join(_short(k, v) for k, v in row.items())
        cells.append(
            Cell(
                f"{spec.name} {label}".strip(),
                load_spec(spec.path, row) if row else spec,
                f"kvspec run {path} {sets}".strip(),
                tuple(row.items()),
            )
        )
    return cells


def excluded_cells(spec: Spec) -> list[Excluded]:
    """The product rows of ``spec``'s axes that a constraint rules out, with the reason."""
    axes, base = spec_axes(spec), _base_values(spec)
    names = list(axes)
    result = []
    for row in itertools.product(*axes.values()):
        broken = violations({**base, **dict(zip(names, row))})
        if broken:
            result.append(Excluded(spec.name, tuple(zip(names, row)), broken[0]))
    return result


def spec_exclusions(spec: Spec) -> list[Exclusion]:
    """``excluded_cells`` of ``spec`` grouped by the constraint that rules them out."""
    groups: dict[str, list[Excluded]] = {}
    for excluded in excluded_cells(spec):
        groups.setdefault(excluded.constraint.label(), []).append(excluded)
    return [
        Exclusion(spec.name, label, found[0].constraint.reason, tuple(e.cell for e in found))
        for label, found in groups.items()
    ]


def report_exclusions() -> list[Exclusion]:
    """Per scenario spec, the cells its matrix would have but a constraint rules out: what
    `kvspec report` lists (printed, report.md, report.json)."""
    return [x for path in default_spec_paths() for x in spec_exclusions(load_spec(path))]


def default_spec_paths() -> list[Path]:
    """Every scenario spec under specs/ (the bug zoo in specs/bugs/ is not one)."""
    return sorted(SPEC_DIR.glob("*.yaml"))


def report_cells(full: bool = False) -> list[Cell]:
    """Every spec × its axes: what `kvspec report` runs (``full``: products)."""
    return [cell for path in default_spec_paths() for cell in spec_cells(load_spec(path), full)]


def _short(axis: str, value: Any) -> str:
    """A compact cell label part: ``ps16``, ``mla``, ``eagle_v2``, ``overlap+``, ``chunk``."""
    if isinstance(value, bool):
        return f"{SHORT.get(axis, axis)}{'+' if value else '-'}"
    return f"ps{value}" if axis == "page_size" else str(value)
