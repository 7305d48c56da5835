"""Launches the vllm driver subprocess and speaks JSON lines with it (ops in, views out).

Keeps: isolation — the driver runs under the vllm venv's own python (its torch, transformers
and vLLM pins) and kvspec never imports vllm. The interpreter is, in order: the explicit
argument (``--vllm-python``), ``$KVSPEC_VLLM_PYTHON``, ``.vllm-venv/bin/python``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "driver" / "main.py"
ENV_VAR = "KVSPEC_VLLM_PYTHON"
VLLM_VERSION = "0.33.0"  # the release the driver follows (ci/vllm_env.sh)


class VLLMUnavailable(RuntimeError):
    """No usable vllm interpreter; the message says how to get one."""


class VLLMDriverError(RuntimeError):
    """The driver refused or failed an op; names the op."""


def vllm_python(explicit: str | Path | None = None) -> Path:
    """The interpreter of the vllm venv (see the module docstring for the order)."""
    return Path(explicit or os.environ.get(ENV_VAR) or ROOT / ".vllm-venv" / "bin" / "python")


class VLLMDriver:
    """One driver subprocess; ``send(op)`` returns the views that op produced, ``result`` the
    op's own answer (``unfinished``: the rids still running)."""

    def __init__(self, python: str | Path | None = None) -> None:
        self.python = vllm_python(python)
        if not self.python.exists():
            raise VLLMUnavailable(
                f"no vllm interpreter at {self.python}: run `make vllm-env`, or point "
                f"--vllm-python / ${ENV_VAR} at a python with vllm {VLLM_VERSION}"
            )
        self.result: Any = None
        self.proc = subprocess.Popen(
            [str(self.python), str(DRIVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        banner = self._read("startup")
        if not banner.get("ready"):
            raise VLLMUnavailable(f"vllm driver did not start: {banner}")
        self.version: str = banner["vllm"]
        self.stubs: list[str] = banner.get("stubs", [])

    def _read(self, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=30)
            raise VLLMUnavailable(
                f"vllm driver exited ({code}) during {what}; run "
                f"`{self.python} {DRIVER}` by hand to see why"
            )
        return json.loads(line)

    def send(self, op: dict[str, Any]) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(op) + "\n")
        answer = self._read(f"op {op.get('op')}")
        if "error" in answer:
            raise VLLMDriverError(f"op {json.dumps(op)[:160]}: {answer['error']}")
        self.result = answer.get("result")
        return answer["views"]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self) -> VLLMDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
