"""kvspec's op trace (invariants/scenarios/ops.py) as a driver's ops: one mapping for every target.

Keeps: the trace a real engine runs is the one kvspec's runner executes
(``scenarios/scenario.build_trace``) — submit with its sampling and session parameters,
open/close session, abort (by rid, or by phase and pick: the driver resolves it against the
engine's own queues), flush the cache, advance the simulated clock. Stepping ops (step,
wait_for, idle) are the stepper's (drive.py). A target declares what it cannot express
before anything runs (its ``unsupported``), so no op is ever dropped here.

Output tokens: a driver whose engine runs no model (the memory classes, vLLM's scheduler with
its runner faked) samples each request's outputs from a seeded draw of the requested length
(``output_ids``): the accounting reads only their count, and prefix matches over them are
self-consistent on each side.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.model.tokenizer import NUM_BYTES
from invariants.scenarios.ops import (
    Abort,
    AdvanceClock,
    CloseSession,
    Disconnect,
    FlushCache,
    Op,
    OpenSession,
    Submit,
)
from invariants.targets.driver import DriverError


def op_message(op: Op) -> dict[str, Any]:
    """A non-stepping op as the driver's op (every driver ignores the fields it has no use for)."""
    if isinstance(op, Submit):
        return submit_message(op)
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
    if isinstance(op, Disconnect):  # an abort to the scheduler; a driver with clients hangs up
        return {"op": "abort", "rid": op.rid, "disconnect": True}
    if isinstance(op, FlushCache):
        return {"op": "flush_cache"}
    if isinstance(op, AdvanceClock):
        return {"op": "advance_clock", "seconds": op.seconds}
    raise DriverError(f"op {op.op}: not an op a driver takes")


def submit_message(op: Submit) -> dict[str, Any]:
    message: dict[str, Any] = {
        "op": "submit",
        "rid": op.rid,
        "input_ids": list(op.input_ids),
        "max_new_tokens": op.max_new_tokens,
        "ignore_eos": op.ignore_eos,
        "min_new_tokens": op.min_new_tokens,
        "return_logprob": op.return_logprob,
        "logprob_start_len": op.logprob_start_len,
    }
    if op.session is not None:
        message["session"] = op.session.params()
    return message


def output_rng(seed: int) -> np.random.Generator:
    """The stream every output id of a trace is drawn from."""
    return np.random.default_rng([seed, 3])


def with_outputs(message: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """A submit with its seeded output ids (``max_new_tokens`` bytes)."""
    return {**message, "output_ids": rng.integers(0, NUM_BYTES, message["max_new_tokens"]).tolist()}
