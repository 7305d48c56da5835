"""The vllm target's tests run only where the vllm venv exists (`make vllm-env`) and when selected
(`-m vllm`, as `make test-vllm` does); `make test` never needs vLLM."""

from __future__ import annotations

import pytest

from invariants.vllm.target import vllm_python


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    python = vllm_python()
    if python.exists() and "vllm" in (config.getoption("-m") or ""):
        return
    why = "no .vllm-venv: run `make vllm-env`" if not python.exists() else "run `make test-vllm`"
    skip = pytest.mark.skip(reason=f"vllm target: {why} (pytest -m vllm)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)
