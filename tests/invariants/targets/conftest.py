"""The real-engine targets' tests: those marked ``sglang`` or ``vllm`` need that engine's venv
and run only when selected (`-m sglang`, `-m vllm`, as `make test-sglang` and `make test-vllm`
do); the PR tier (`make test`) never needs a real engine and runs the rest."""

from __future__ import annotations

import pytest

from invariants.targets.sglang.adapter import sglang_python, unavailable_reason
from invariants.targets.vllm.adapter import vllm_python


def _why_not(marker: str, selected: str) -> str | None:
    """Why a test marked ``marker`` does not run here (None: it runs)."""
    if marker == "sglang":
        missing = unavailable_reason(sglang_python())
    else:
        python = vllm_python()
        missing = None if python.exists() else "no .vllm-venv: run `make vllm-env`"
    if missing is None and marker in selected:
        return None
    return missing or f"real-engine test: run `make test-{marker}` (pytest -m {marker})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = config.getoption("-m") or ""
    for marker in ("sglang", "vllm"):
        why = _why_not(marker, selected)
        if why is None:
            continue
        skip = pytest.mark.skip(reason=f"{marker} target: {why}")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
