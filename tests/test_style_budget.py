"""The size budget of docs/design.md §7, on ruff-formatted code (make lint checks the formatting,
so no line packing can hide a long function): every Python file ≤ 400 lines; every function of the
packages ≤ 40 lines from its ``def`` to its last line (kernels/: ≤ 80, and a Triton kernel's
parameter list — its launch ABI, one parameter per line once formatted — is not counted)."""

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


def function_length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the last line; a Triton kernel's from its first body line."""
    jit = any("jit" in ast.unparse(d) for d in node.decorator_list)
    start = node.body[0].lineno if jit else node.lineno
    return (node.end_lineno or node.lineno) - start + 1


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
                if (length := function_length(node)) > limit:
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long


def test_the_measure_counts_signatures_except_a_kernels() -> None:
    """A plain function's parameter list counts; a ``@triton.jit`` kernel's does not."""
    source = (
        "def f(\n    a,\n    b,\n):\n    return a\n\n\n@triton.jit\ndef k(\n    a,\n):\n    x = a\n"
    )
    plain, kernel = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    assert function_length(plain) == 5 and function_length(kernel) == 1
