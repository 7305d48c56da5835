"""The size budget of DESIGN.md: every Python file ≤ 400 lines; every function of the
packages ≤ 40 lines (Triton kernels in kernels/ ≤ 80)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "kernels", "invariants")


def python_files() -> list[Path]:
    return [p for top in (*PACKAGES, "tests") for p in sorted((ROOT / top).rglob("*.py"))]


def test_files_fit_the_line_budget() -> None:
    """No Python file is longer than 400 lines: split along the architecture instead."""
    long = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in python_files()
        if (n := len(p.read_text().splitlines())) > 400
    ]
    assert not long, long


def test_functions_fit_the_line_budget() -> None:
    """No function of the packages is longer than 40 lines (kernels: 80)."""
    long = []
    for p in python_files():
        top = p.relative_to(ROOT).parts[0]
        if top not in PACKAGES:
            continue
        limit = 80 if top == "kernels" else 40
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long
