"""The sglang target's adapter (the ``Adapter`` of targets/registry.py): real SGLang 0.5.23's
memory classes on CPU — its allocator, pools, ``UnifiedRadixCache``, streaming sessions,
``release_kv_cache`` … — in the sglang venv, under kvspec's own scheduler glue
(``driver/glue.py``), with no model.

Keeps: an engine feature or op the glue does not reproduce makes the whole trace unsupported,
with the reason — never dropped; the one schedule difference a run accepts (no chunked
prefill: prompts longer than the chunk prefill whole) is said in its notes. The interpreter
is, in order: the explicit one, ``$KVSPEC_SGLANG_PYTHON``, ``.sglang-venv/bin/python``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.model.tokenizer import BOS_ID
from engine.view import StateView
from invariants.scenarios.ops import Submit, Trace
from invariants.scenarios.spec import EngineSpec, vllm_only_fields
from invariants.targets.drive import Drive
from invariants.targets.driver import LineDriver, TargetUnavailable
from invariants.targets.registry import TargetOptions
from invariants.targets.views import to_state_view

ROOT = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).resolve().parent / "driver" / "main.py"
ANCHOR = DRIVER.with_name("anchor.py")  # the anchor workload on SGLang's memory path
ENV_VAR = "KVSPEC_SGLANG_PYTHON"
SGLANG_VERSION = "0.5.23"  # the release the glue follows
UNSUPPORTED_OPS = {
    "force_retract": "force_retract: the glue has no retraction (SGLang's retract_decode is "
    "not driven)",
    "flush_cache": "flush_cache: the glue does not drive Scheduler.flush_cache",
}


def sglang_python(explicit: str | Path | None = None) -> Path:
    """The interpreter of the sglang venv (see the module docstring for the order)."""
    chosen = explicit or os.environ.get(ENV_VAR) or ROOT / ".sglang-venv" / "bin" / "python"
    return Path(chosen)


def unavailable_reason(python: Path) -> str | None:
    """Why the sglang target cannot run with ``python`` (None: it can)."""
    if not python.exists():
        return (
            f"no sglang interpreter at {python}: run `make sglang-env`, or point "
            f"--target-python / ${ENV_VAR} at a python with sglang {SGLANG_VERSION}"
        )
    return None


def open_driver(options: TargetOptions) -> LineDriver:
    python = sglang_python(options.python)
    reason = unavailable_reason(python)
    if reason:
        raise TargetUnavailable(reason)
    return LineDriver("sglang", python, DRIVER)


def unsupported_engine(engine: EngineSpec) -> list[str]:
    """Engine features of a spec that the sglang glue does not reproduce."""
    checks = {
        "cache: chunk": engine.cache != "radix",
        "speculative": engine.speculative is not None,
        "test_retract": engine.test_retract,
        "enable_mixed_chunk": engine.enable_mixed_chunk,
        "model: tiny": engine.model != "sim",
        "eos_prob > 0 (lengths would be the model's)": engine.eos_prob > 0,
    }
    vllm_only = [
        f"{name} (a vLLM feature: the vllm target only)" for name in vllm_only_fields(engine)
    ]
    return [name for name, on in checks.items() if on] + vllm_only


def unsupported(trace: Trace, version: str | None = None) -> list[str]:
    """Why ``trace`` cannot run on the sglang target (empty: it can)."""
    ops = sorted({UNSUPPORTED_OPS[op.op] for op in trace.ops if op.op in UNSUPPORTED_OPS})
    return unsupported_engine(trace.engine) + ops


def config(
    trace: Trace, fault: dict[str, Any] | None = None, observe: bool = True
) -> dict[str, Any]:
    """The driver's config op for the trace's engine (kvspec's own limits: input length,
    BOS); ``fault``: patched into SGLang's allocator (``skip_free`` | ``double_free``)."""
    engine = trace.engine
    return {
        "op": "config",
        "page_size": engine.page_size,
        "pool_tokens": engine.max_total_tokens,
        "swa_tokens": engine.swa_tokens,
        "sliding_window": engine.sliding_window,
        "max_reqs": engine.max_num_reqs,
        "max_context": engine.context_len,
        "batch": engine.max_running_requests or engine.max_num_reqs,
        "max_prefill_tokens": engine.chunked_prefill_size or 16384,
        "max_input_len": engine.engine_config(trace.seed).max_req_input_len,
        "bos_id": BOS_ID,
        "fault": fault,
    }


def decoder() -> Callable[[dict[str, Any]], StateView]:
    return to_state_view


def notes(trace: Trace, drive: Drive) -> tuple[str, ...]:
    """The one schedule difference a run accepts: prompts longer than the chunk prefill whole
    on the glue, which does not split a prefill."""
    chunk = trace.engine.chunked_prefill_size
    longest = max((len(op.input_ids) for op in trace.ops if isinstance(op, Submit)), default=0)
    if chunk and longest > chunk:
        return (
            f"chunked prefill not reproduced: prompts up to {longest} tokens prefill whole "
            f"(chunked_prefill_size={chunk})",
        )
    return ()


def anchor(
    page_sizes: list[int],
    batches: list[int],
    runs: int,
    warmup: int,
    seed: int,
    options: TargetOptions,
) -> dict[str, Any]:
    """The anchor workload on SGLang's own memory path (`kvspec bench anchor --target sglang`:
    driver/anchor.py, with kvspec's seed, cells, runs and warm-up), its JSON document; a run
    that fails names the interpreter and the driver's last words."""
    python = sglang_python(options.python)
    reason = unavailable_reason(python)
    if reason:
        raise TargetUnavailable(reason)
    args = ["--seed", str(seed), "--runs", str(runs), "--warmup", str(warmup)]
    args += ["--page-sizes", ",".join(map(str, page_sizes))]
    args += ["--batches", ",".join(map(str, batches))]
    command = [str(python), str(ANCHOR), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, cwd=ANCHOR.parent)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise TargetUnavailable(f"the sglang anchor failed under {python}: {tail}")
    return json.loads(done.stdout)
