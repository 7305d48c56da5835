"""Launches the vllm driver subprocess (the sglang target's ``LineDriver``: JSON lines, ops in,
views out).

Keeps: isolation — the driver runs under the vllm venv's own python (its torch, transformers
and vLLM pins) and kvspec never imports vllm. The interpreter is, in order: the explicit
argument, ``$KVSPEC_VLLM_PYTHON``, ``.vllm-venv/bin/python``.
"""

from __future__ import annotations

import os
from pathlib import Path

from invariants.targets.sglang.target import LineDriver

ROOT = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).resolve().parent / "driver" / "main.py"
ENV_VAR = "KVSPEC_VLLM_PYTHON"
VLLM_VERSION = "0.33.0"  # the release the driver follows (ci/vllm_env.sh)


class VLLMUnavailable(RuntimeError):
    """No usable vllm interpreter; the message says how to get one."""


def vllm_python(explicit: str | Path | None = None) -> Path:
    """The interpreter of the vllm venv (see the module docstring for the order)."""
    return Path(explicit or os.environ.get(ENV_VAR) or ROOT / ".vllm-venv" / "bin" / "python")


class VLLMDriver(LineDriver):
    """The vllm target's driver (driver/main.py, vLLM's v1 scheduler)."""

    name = banner_key = "vllm"
    unavailable = VLLMUnavailable

    def __init__(self, python: str | Path | None = None) -> None:
        chosen = vllm_python(python)
        if not chosen.exists():
            raise VLLMUnavailable(
                f"no vllm interpreter at {chosen}: run `make vllm-env`, or point "
                f"${ENV_VAR} at a python with vllm {VLLM_VERSION}"
            )
        super().__init__(chosen, DRIVER)
