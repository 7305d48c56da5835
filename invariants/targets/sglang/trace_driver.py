"""kvspec's op trace (invariants/scenarios/ops.py) on the sglang driver: each op as the driver's
JSON op.

Keeps: the same ``Trace`` kvspec's runner executes (``invariants/scenarios/scenario.build_trace``)
is what the sglang target executes — submit with its session parameters, open/close session, abort
(by rid, or by phase and pick, resolved by the driver against SGLang's own queues), step, wait_for,
idle, advance_clock (the driver's simulated clock, read by SGLang's session timeouts). An op or
engine feature the glue cannot reproduce makes the whole trace unsupported, with the reason — never
dropped. Output tokens: SGLang's classes run no model, so each request's output ids are a seeded
draw (``output_rng``); the memory accounting reads only their count, and prefix matches over them
are self-consistent on each side.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.model.tokenizer import BOS_ID, NUM_BYTES
from invariants.scenarios.ops import (
    Abort,
    AdvanceClock,
    CloseSession,
    FlushCache,
    Idle,
    Op,
    OpenSession,
    Step,
    Submit,
    Trace,
    WaitFor,
)
from invariants.scenarios.spec import EngineSpec
from invariants.targets.sglang.target import DriverError, SGLangDriver

UNSUPPORTED_OPS = {
    "force_retract": (
        "force_retract: the glue has no retraction (SGLang's retract_decode is not driven)"
    ),
    "flush_cache": "flush_cache: the glue does not drive Scheduler.flush_cache",
}
DRAIN_STEPS = 200_000
View = dict[str, Any]


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
    return [name for name, on in checks.items() if on]


def unsupported(trace: Trace) -> list[str]:
    """Why ``trace`` cannot run on the sglang target (empty: it can)."""
    ops = sorted({UNSUPPORTED_OPS[op.op] for op in trace.ops if op.op in UNSUPPORTED_OPS})
    return unsupported_engine(trace.engine) + ops


def driver_config(
    engine: EngineSpec, seed: int = 0, fault: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The driver's config op for an engine section (kvspec's own limits: input length, BOS)."""
    config = engine.engine_config(seed)
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
        "max_input_len": config.max_req_input_len,
        "bos_id": BOS_ID,
        "fault": fault,
    }


def output_rng(seed: int) -> np.random.Generator:
    """The stream every output id is drawn from (one per trace)."""
    return np.random.default_rng([seed, 3])


def submit_op(op: Submit, rng: np.random.Generator) -> dict[str, Any]:
    out: dict[str, Any] = {
        "op": "submit",
        "rid": op.rid,
        "input_ids": list(op.input_ids),
        "max_new_tokens": op.max_new_tokens,
        "ignore_eos": op.ignore_eos,
        "min_new_tokens": op.min_new_tokens,
        "output_ids": rng.integers(0, NUM_BYTES, op.max_new_tokens).tolist(),
        "return_logprob": op.return_logprob,
        "logprob_start_len": op.logprob_start_len,
    }
    if op.session is not None:
        out["session"] = op.session.params()
    return out


class TraceDriver:
    """One trace on one driver: ``apply(op)`` returns the views the op produced; ``step``
    takes an optional lockstep plan (``{"mode": extend|decode|idle, "rids"}``)."""

    def __init__(self, driver: SGLangDriver, seed: int) -> None:
        self.driver, self.rng, self.used = driver, output_rng(seed), set()
        self.steps = 0

    def step(self, plan: dict[str, Any] | None = None) -> list[View]:
        self.steps += 1
        return self.driver.send({"op": "step"} if plan is None else {"op": "step", "plan": plan})

    def idle(self) -> list[View]:
        return self.driver.send({"op": "idle"})

    def apply(self, op: Op) -> list[View]:
        """One non-stepping op, or a stepping one (step, wait_for, idle) in anchor mode."""
        if isinstance(op, Submit):
            if op.rid in self.used:  # kvspec skips a reused rid
                return []
            self.used.add(op.rid)
            return self.driver.send(submit_op(op, self.rng))
        if isinstance(op, OpenSession):
            return self.driver.send(
                {
                    "op": "open_session",
                    "session_id": op.sid,
                    "streaming": op.streaming,
                    "timeout": op.timeout,
                }
            )
        if isinstance(op, CloseSession):
            return self.driver.send({"op": "close_session", "session_id": op.sid})
        if isinstance(op, Abort):
            return self.driver.send(
                {"op": "abort", "rid": op.rid, "phase": op.phase, "pick": op.pick}
            )
        if isinstance(op, AdvanceClock):
            return self.driver.send({"op": "advance_clock", "seconds": op.seconds})
        if isinstance(op, FlushCache):  # a driver that has it (the vllm target's)
            return self.driver.send({"op": "flush_cache"})
        if isinstance(op, Step):
            return [v for _ in range(op.n) for v in self.step()]
        if isinstance(op, WaitFor):
            return self._wait_for(op.rids, op.max_steps)
        if isinstance(op, Idle):
            return self.drain(op.max_steps)
        raise DriverError(f"op {op.op}: not supported by the sglang target")

    def _wait_for(self, rids: list[str], max_steps: int) -> list[View]:
        views: list[View] = []
        for _ in range(max_steps):
            self.driver.send({"op": "unfinished", "rids": rids})
            if not self.driver.result:
                return views
            views += self.step()
        raise DriverError(f"wait_for {rids}: still running after {max_steps} steps")

    def drain(self, max_steps: int = DRAIN_STEPS) -> list[View]:
        """Step to idle; the last view is the idle event's."""
        views: list[View] = []
        for _ in range(max_steps):
            idle = self.idle()
            if idle:
                return views + idle
            views += self.step()
        raise DriverError(f"not idle after {max_steps} steps")
