"""The matrix axes of ci/matrix.yaml: what each axis value means as engine fields, which
value an engine has on each axis, and the declared constraints between axis values.

Keeps: ``apply_axes`` then ``axis_values`` round-trips (an engine built from axis values
reads back as those values), so a cell's name, its replay command (``--set axis=value``) and
its engine always agree; a combination is invalid only through a declared constraint with
a reason.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from invariants.checking.loader import read_yaml

ROOT = Path(__file__).resolve().parents[2]
MATRIX_PATH = ROOT / "ci" / "matrix.yaml"
AXIS_NAMES = ("page_size", "attention", "speculative", "retract", "mixed_chunk", "overlap", "cache")
DEFAULT_WINDOW = 64
MLA_TINY = {"attention": "mla", "num_layers": 1, "dtype": "float64"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Constraint(_Strict):
    """``when`` the row has these values, it must have the ``require`` values (a list: any of)."""

    when: dict[str, Any]
    require: dict[str, Any]
    reason: str

    @staticmethod
    def _allowed(value: Any) -> list[Any]:
        return list(value) if isinstance(value, list) else [value]

    def violated(self, row: dict[str, Any]) -> bool:
        """True if ``row`` (possibly partial) already breaks this constraint."""
        names = [*self.when, *self.require]
        if any(n not in row for n in names):
            return False
        applies = all(row[k] in self._allowed(v) for k, v in self.when.items())
        return applies and not all(row[k] in self._allowed(v) for k, v in self.require.items())

    def label(self) -> str:
        def fmt(d: dict[str, Any]) -> str:
            return ", ".join(
                f"{k}={'|'.join(map(axis_label, self._allowed(v)))}" for k, v in d.items()
            )

        return f"{fmt(self.when)} requires {fmt(self.require)}"


class MatrixFile(_Strict):
    version: Literal[1] = 1
    axes: dict[str, list[Any]]
    constraints: list[Constraint] = []

    @field_validator("axes")
    @classmethod
    def _known_axes(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        unknown = sorted(set(axes) - set(AXIS_NAMES))
        if unknown:
            raise ValueError(f"unknown axes {unknown} (known: {', '.join(AXIS_NAMES)})")
        return axes


@functools.lru_cache(maxsize=4)
def load_matrix(path: str | Path = MATRIX_PATH) -> MatrixFile:
    """ci/matrix.yaml, validated (cached: specs consult it at load)."""
    return MatrixFile.model_validate(dict(read_yaml(Path(path).read_text())))


def axis_label(value: Any) -> str:
    """``True`` → on, ``False`` → off, anything else as written."""
    return (
        {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)
    )


def violations(row: dict[str, Any], matrix: MatrixFile | None = None) -> list[Constraint]:
    """The declared constraints ``row`` breaks."""
    return [c for c in (matrix or load_matrix()).constraints if c.violated(row)]


def apply_axes(engine: dict[str, Any], cell: dict[str, Any]) -> dict[str, Any]:
    """``engine`` (spec fields) with each axis value of ``cell`` applied."""
    fields = dict(engine)
    for axis, value in cell.items():
        fields = _APPLY[axis](fields, value)
    return fields


def axis_values(engine: dict[str, Any]) -> dict[str, Any]:
    """The value an engine (spec fields, defaults filled) has on every axis."""
    tiny = engine.get("tiny") or {}
    spec = engine.get("speculative")
    attention = (
        "mla"
        if engine.get("model") == "tiny" and tiny.get("attention") == "mla"
        else "swa"
        if engine.get("swa_tokens") is not None
        else "mha"
    )
    speculative = (
        "none" if spec is None else ("eagle_v2" if spec.get("version", 2) == 2 else "eagle")
    )
    return {
        "page_size": engine["page_size"],
        "attention": attention,
        "speculative": speculative,
        "retract": engine["test_retract"],
        "mixed_chunk": engine["enable_mixed_chunk"],
        "overlap": engine["enable_overlap"],
        "cache": engine["cache"],
    }


def _page_size(f: dict[str, Any], value: int) -> dict[str, Any]:
    chunk = f.get("chunked_prefill_size", 8192)
    return {
        **f,
        "page_size": value,
        "chunked_prefill_size": None if chunk is None else max(chunk, value),
    }


def _attention(f: dict[str, Any], value: str) -> dict[str, Any]:
    tiny = {
        k: v
        for k, v in (f.get("tiny") or {}).items()
        if k not in ("attention", "attention_pattern")
    }
    window = f.get("sliding_window") or DEFAULT_WINDOW
    f = {**f, "swa_tokens": None, "sliding_window": None}
    if value == "swa":
        f |= {"swa_tokens": f.get("max_total_tokens", 4096), "sliding_window": window}
        if f.get("model") == "tiny":
            tiny["attention_pattern"] = "FS"
    elif value == "mla":
        f["model"], tiny = "tiny", {**MLA_TINY, **tiny, "attention": "mla"}
    elif f.get("model") == "tiny":
        tiny["attention"] = "gqa"
    return {**f, "tiny": tiny}


def _speculative(f: dict[str, Any], value: str) -> dict[str, Any]:
    if value == "none":
        return {**f, "speculative": None}
    return {
        **f,
        "speculative": {**(f.get("speculative") or {}), "version": 2 if value == "eagle_v2" else 1},
    }


_APPLY: dict[str, Any] = {
    "page_size": _page_size,
    "attention": _attention,
    "speculative": _speculative,
    "retract": lambda f, v: {**f, "test_retract": bool(v)},
    "mixed_chunk": lambda f, v: {**f, "enable_mixed_chunk": bool(v)},
    "overlap": lambda f, v: {**f, "enable_overlap": bool(v)},
    "cache": lambda f, v: {**f, "cache": v},
}
