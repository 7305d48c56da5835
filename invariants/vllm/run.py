"""Scenario specs on vLLM v1's real scheduler (the vllm target), checked by the same Checker and
catalog at every step.

Keeps: a run is a pure function of its trace (the spec's ``build_trace``, what kvspec's runner
executes), played through the sglang target's ``TraceDriver`` (the same JSON-lines ops); a
spec feature vLLM's scheduler has no counterpart for (sessions, SWA pools, EAGLE, the tiny
model, forced retracts) makes the run unsupported with the reason, never a silent pass; an op
the driver refuses is the outcome's error.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from invariants.checking.checker import Checker, Level
from invariants.checking.loader import Catalog
from invariants.scenarios.ops import CloseSession, OpenSession, Trace
from invariants.scenarios.runner import spec_catalog
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import EngineSpec, Spec
from invariants.sglang.run import GOALS, SGLangOutcome, SGLangStats, drive_trace
from invariants.vllm.target import VLLMDriver

UNSUPPORTED_OPS = {
    "force_retract": "force_retract: vLLM preempts under pressure only",
    "flush_cache": "flush_cache: not driven on vLLM yet",
}


def unsupported(trace: Trace) -> list[str]:
    """Why ``trace`` cannot run on vLLM's scheduler (empty: it can)."""
    e: EngineSpec = trace.engine
    checks = {
        "sessions (vLLM has no session API here)": any(
            isinstance(op, OpenSession | CloseSession) or getattr(op, "session", None)
            for op in trace.ops
        ),
        "SWA pools (swa_tokens)": e.swa_tokens is not None,
        "speculative": e.speculative is not None,
        "model: tiny": e.model != "sim",
        "cache: chunk": e.cache != "radix",
        "test_retract": e.test_retract,
        "eos_prob > 0": e.eos_prob > 0,
    }
    ops = sorted({UNSUPPORTED_OPS[op.op] for op in trace.ops if op.op in UNSUPPORTED_OPS})
    return [name for name, on in checks.items() if on] + ops


def driver_config(engine: EngineSpec, fault: dict[str, Any] | None = None) -> dict[str, Any]:
    """The driver's config op: kvspec's pool of ``max_total_tokens`` as blocks of the page
    size (plus vLLM's null block), its batch limits, prefix caching for the radix cache."""
    return {
        "op": "config",
        "block_size": engine.page_size,
        "num_blocks": engine.max_total_tokens // engine.page_size + 1,
        "max_num_seqs": engine.max_running_requests or engine.max_num_reqs,
        "max_num_batched_tokens": engine.chunked_prefill_size or 8192,
        "max_model_len": engine.context_len,
        "prefix_caching": engine.cache == "radix",
        "fault": fault,
    }


def run_spec_on_vllm(
    spec: Spec, catalog: Catalog, level: int = Level.RECORD, python: str | None = None,
    *, fault: dict[str, Any] | None = None, driver: VLLMDriver | None = None,
) -> SGLangOutcome:  # fmt: skip
    """``spec``'s trace on vLLM's real scheduler under the checker (SpecOutcome-compatible)."""
    trace = build_trace(spec)
    missing = unsupported(trace)
    if missing:
        why = f"not supported by the vllm target: {'; '.join(missing)}"
        return SGLangOutcome(spec, SGLangStats(), (), (), 0, 0.0, why, unsupported=tuple(missing))
    checker = Checker(spec_catalog(spec, catalog), level=level)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        live = driver if driver is not None else stack.enter_context(VLLMDriver(python))
        counts, error = _drive(live, trace, checker, fault)
        version = live.version
    checks = sum(s.evaluations for s in checker.stats().values())
    stats = SGLangStats(**{k: v for k, v in counts.items() if k in SGLangStats.__slots__})
    unmet = tuple(
        f"{name} >= {least} (got {getattr(stats, GOALS[name])})"
        for name, least in spec.expect.items()
        if name in GOALS and getattr(stats, GOALS[name]) < least
    )
    seconds = time.perf_counter() - start
    notes = (f"preemptions: {counts['preempted']}",)
    notes += (f"fault fired on blocks {counts['fault_fired']}",) if fault else ()
    return SGLangOutcome(spec, stats, tuple(checker.violations), unmet, checks, seconds, error,
                         version, notes=notes)  # fmt: skip


def _drive(
    driver: VLLMDriver, trace: Trace, checker: Checker, fault: dict[str, Any] | None
) -> tuple[dict[str, Any], str | None]:
    """The trace through the real-engine targets' ``drive_trace``, plus what the fault did."""
    counts, _, error = drive_trace(driver, trace, driver_config(trace.engine, fault), checker)
    return {**counts, "fault_fired": driver.result["fault_fired"]}, error
