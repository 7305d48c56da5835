"""kvspec's op trace on SGLang's real scheduler: the engine section as the driver's config, each
op as the driver's op, and what the real scheduler cannot express said before anything runs.

Keeps: the trace is the project's one format (``invariants/scenarios/ops.py``), the same one
kvspec's runner, the explorer and ``kvspec replay`` execute. A step is one iteration of
SGLang's own event loop, whatever it decides to run; a retract is SGLang's own test hook
(``test_retract`` every ``test_retract_interval`` forwards), never an op; output tokens are
the fake worker's seeded draws (``driver/sched_worker.token_at``), EOS included; time is
the driver's simulated clock (kvspec's tick per iteration, plus ``advance_clock``).

What a trace may use beyond the plain features depends on the release: its shim's
``SUPPORTS`` (read from the shim's source, so a trace is refused before any driver starts).
A ``speculative`` section runs as SGLang's EAGLE flags (topk 1) with the fake draft worker's
seeded accept lengths (``accept_prob`` per draft); the release picks its worker — 0.5.23 has
only the spec-v2 one, so a v1 spec (overlap off) runs 0.5.23's synchronous spec-v2 path.
"""

from __future__ import annotations

import ast
from typing import Any

from engine.config.speculative import SpecConfig
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
from invariants.targets.sglang_scheduler.target import DEFAULT_VERSION, SchedulerDriver, shim_path
from invariants.targets.sglang.target import DriverError

EOS_ID = 257  # the driver's model config (driver/model/config.json) and kvspec's tokenizer
UNSUPPORTED_OPS = {
    "force_retract": "force_retract: the real scheduler retracts through its own test hook "
    "(engine: test_retract, test_retract_interval), not on demand",
}
Answer = dict[str, Any]


def release_supports(version: str | None = None) -> frozenset[str]:
    """The engine features beyond the plain ones that the release's shim drives: its
    module-level ``SUPPORTS`` set literal (none: no such assignment, or no shim)."""
    path = shim_path(version or DEFAULT_VERSION)
    if not path.exists():
        return frozenset()
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "SUPPORTS" for t in targets):
            return frozenset(ast.literal_eval(node.value))  # type: ignore[union-attr]
    return frozenset()


def unsupported_engine(engine: EngineSpec, version: str | None = None) -> list[str]:
    """Engine features of a spec the release's real-scheduler shim does not drive (yet)."""
    release = version or DEFAULT_VERSION
    supports = release_supports(release)
    checks = {
        f"speculative (EAGLE: sglang {release}'s shim drives no draft worker)": (
            engine.speculative is not None and "speculative" not in supports
        ),
        "swa_tokens (hybrid SWA pools are not built by the shims)": engine.swa_tokens is not None,
        "model: tiny (the target's forward is the fake worker)": engine.model != "sim",
    }
    return [name for name, on in checks.items() if on]


def unsupported(trace: Trace, version: str | None = None) -> list[str]:
    """Why ``trace`` cannot run on the release's real scheduler (empty: it can)."""
    ops = sorted({UNSUPPORTED_OPS[op.op] for op in trace.ops if op.op in UNSUPPORTED_OPS})
    return unsupported_engine(trace.engine, version) + ops


def config_op(engine: EngineSpec, seed: int) -> dict[str, Any]:
    """The driver's config op: SGLang's server arguments for the spec's engine section."""
    config = engine.engine_config(seed)
    return {
        "op": "config",
        "page_size": engine.page_size,
        "pool_tokens": engine.max_total_tokens,
        "max_reqs": engine.max_num_reqs,
        "max_context": engine.context_len,
        "max_running_requests": config.running_limit,
        "chunked_prefill_size": engine.chunked_prefill_size,
        "max_prefill_tokens": config.max_prefill_tokens,
        "overlap": engine.enable_overlap,
        "mixed_chunk": engine.enable_mixed_chunk,
        "cache": engine.cache,
        "streaming_sessions": engine.enable_streaming_session,
        "retract_interval": engine.test_retract_interval if engine.test_retract else 0,
        "seed": seed,
        "eos_prob": engine.eos_prob,
        "eos_id": EOS_ID,
        "speculative": _speculative(config.speculative),
    }


def _speculative(spec: SpecConfig | None) -> dict[str, Any] | None:
    """The EAGLE section of the config op (None: no speculative decoding)."""
    if spec is None:
        return None
    return {
        "num_steps": spec.num_steps,
        "num_draft_tokens": spec.num_draft_tokens,
        "accept_prob": spec.accept_prob,
    }


def op_message(op: Op) -> dict[str, Any]:
    """A non-stepping op as the driver's op."""
    if isinstance(op, Submit):
        message: dict[str, Any] = {
            "op": "submit",
            "rid": op.rid,
            "input_ids": list(op.input_ids),
            "max_new_tokens": op.max_new_tokens,
            "ignore_eos": op.ignore_eos,
        }
        if op.session is not None:
            message["session"] = op.session.params()
        return message
    if isinstance(op, OpenSession):
        return {
            "op": "open_session",
            "session_id": op.sid,
            "streaming": op.streaming,
            "timeout": op.timeout,
        }
    if isinstance(op, CloseSession):
        return {"op": "close_session", "session_id": op.sid}
    if isinstance(op, Abort):
        return {"op": "abort", "rid": op.rid, "phase": op.phase, "pick": op.pick}
    if isinstance(op, FlushCache):
        return {"op": "flush_cache"}
    if isinstance(op, AdvanceClock):
        return {"op": "advance_clock", "seconds": op.seconds}
    raise DriverError(f"op {op.op}: not supported by the sglang-scheduler target")


class SchedulerTrace:
    """One trace's ops on one driver. Each call returns the answers of the iterations it
    ran (``views``: the step view, and a session view after an iteration that took session
    ops; ``sglang``: what SGLang's own checkers said), in order."""

    def __init__(self, driver: SchedulerDriver) -> None:
        self.driver, self.used = driver, set[str]()
        self.iterations = 0

    def apply(self, op: Op) -> list[Answer]:
        if isinstance(op, Step):
            return [self.step() for _ in range(op.n)]
        if isinstance(op, WaitFor):
            return self.wait_for(op.rids, op.max_steps)
        if isinstance(op, Idle):
            return self.drain(op.max_steps)
        if isinstance(op, Submit):
            if op.rid in self.used:  # kvspec skips a reused rid, and so does this target
                return []
            self.used.add(op.rid)
        self.driver.send(op_message(op))
        return []

    def step(self) -> Answer:
        self.iterations += 1
        return self.driver.send({"op": "step"})

    def wait_for(self, rids: list[str], max_steps: int) -> list[Answer]:
        """Iterate until ``rids`` finished, at most ``max_steps`` times (then the trace goes
        on, as on kvspec's runner: a client stops waiting, it is no failure)."""
        answers: list[Answer] = []
        for _ in range(max_steps):
            if not self.driver.send({"op": "unfinished", "rids": rids})["result"]:
                break
            answers.append(self.step())
        return answers

    def drain(self, max_steps: int) -> list[Answer]:
        """Iterate to idle; the last answer carries the idle view."""
        answers: list[Answer] = []
        for _ in range(max_steps):
            idle = self.driver.send({"op": "idle"})
            if idle["result"]:
                return [*answers, idle]
            answers.append(self.step())
        raise DriverError(f"not idle after {max_steps} iterations")
