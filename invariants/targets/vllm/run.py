"""Scenario specs on vLLM v1's real scheduler (the vllm target), checked by the same Checker and
catalog at every step.

Keeps: a run is a pure function of its trace (the spec's ``build_trace``, what kvspec's runner
executes), played through the sglang target's ``TraceDriver`` (the same JSON-lines ops); a
spec feature vLLM's scheduler has no counterpart for (sessions, the tiny model, forced
retracts, speculation under async scheduling) makes the run unsupported with the reason,
never a silent pass; an op the driver refuses is the outcome's error.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

from invariants.checking.checker import Checker, Level
from invariants.checking.loader import Catalog
from invariants.scenarios.ops import CloseSession, OpenSession, Trace
from invariants.scenarios.runner import spec_catalog
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import EngineSpec, Spec
from invariants.targets.sglang.run import SGLangOutcome, SGLangStats, drive_trace, unmet_goals
from invariants.targets.vllm.blocks import BlockMirror
from invariants.targets.vllm.target import VLLMDriver

UNSUPPORTED_OPS = {
    "force_retract": "force_retract: vLLM preempts under pressure only",
}


def unsupported(trace: Trace) -> list[str]:
    """Why ``trace`` cannot run on vLLM's scheduler (empty: it can)."""
    e: EngineSpec = trace.engine
    checks = {
        "sessions (vLLM has no session API here)": any(
            isinstance(op, OpenSession | CloseSession) or getattr(op, "session", None)
            for op in trace.ops
        ),
        "speculative with overlap (vLLM's async spec decoding is not driven)": (
            e.speculative is not None and e.enable_overlap
        ),
        "model: tiny": e.model != "sim",
        "test_retract": e.test_retract,
    }
    ops = sorted({UNSUPPORTED_OPS[op.op] for op in trace.ops if op.op in UNSUPPORTED_OPS})
    return [name for name, on in checks.items() if on] + ops


def driver_config(engine: EngineSpec, fault: dict[str, Any] | None = None) -> dict[str, Any]:
    """The driver's config op: kvspec's pool of ``max_total_tokens`` as blocks of the page
    size (plus vLLM's null block), its batch limits, prefix caching for the radix cache (the
    chunk cache: none). A hybrid SWA spec becomes a full and a sliding-window KV-cache group
    over one block pool as large as kvspec's two pools together (vLLM pools all groups'
    blocks); overlap is async scheduling; EAGLE is vLLM's EAGLE with as many drafts."""
    tokens = engine.max_total_tokens + (engine.swa_tokens or 0)
    return {
        "op": "config",
        "block_size": engine.page_size,
        "num_blocks": tokens // engine.page_size + 1,
        "sliding_window": engine.sliding_window if engine.swa_tokens else None,
        "async_scheduling": engine.enable_overlap,  # kvspec's overlap = vLLM's async scheduling
        # EAGLE's top-1 chain: num_steps draft tokens per verify, as many lookahead slots
        "num_speculative_tokens": (engine.speculative or {}).get("num_steps", 3)
        if engine.speculative is not None
        else 0,
        "accept_prob": (engine.speculative or {}).get("accept_prob", 0.7),
        "eos_prob": engine.eos_prob,  # the runner samples EOS this often (seeded)
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
    outcome = run_trace_on_vllm(
        trace, spec_catalog(spec, catalog), level, python, fault=fault, driver=driver
    )
    return replace(outcome, spec=spec, unmet=unmet_goals(spec, outcome.stats))


def run_trace_on_vllm(
    trace: Trace, catalog: Catalog, level: int = Level.RECORD, python: str | None = None,
    *, fault: dict[str, Any] | None = None, driver: VLLMDriver | None = None,
    keep_views: bool = False,
) -> SGLangOutcome:  # fmt: skip
    """A trace's ops on vLLM's scheduler under the checker, then the drain to idle (level 2:
    no op after the first violating view, every invariant of that view evaluated)."""
    missing = unsupported(trace)
    if missing:
        raise ValueError(f"{trace.name}: not supported by the vllm target: {'; '.join(missing)}")
    checker = Checker(catalog, level=min(level, Level.RECORD))
    start = time.perf_counter()
    config = driver_config(trace.engine, fault)
    with contextlib.ExitStack() as stack:
        live = driver if driver is not None else stack.enter_context(VLLMDriver(python))
        strict = level >= Level.STRICT
        drive = drive_trace(live, trace, config, checker, keep_views, strict, BlockMirror().view)
        driven, version = live.result, live.version
    counts = drive.counts
    stats = SGLangStats(**{k: v for k, v in counts.items() if k in SGLangStats.__slots__})
    checks = sum(s.evaluations for s in checker.stats().values())
    notes = (f"scheduler: {driven['scheduler']}", f"preemptions: {counts['preempted']}")
    fired = driven["fault_fired"]
    if driven.get("drafts"):
        notes += ("drafts accepted: {} of {} verified".format(*driven["drafts"]),)
    notes += (f"fault fired on blocks {fired}",) if fault else ()
    return SGLangOutcome(
        None, stats, tuple(checker.violations), (), checks, time.perf_counter() - start,
        drive.error, version, views=tuple(drive.kept), notes=notes, stopped_at=drive.stopped_at,
    )  # fmt: skip
