"""The op trace: the one format that scenario specs, the explorer, the bug zoo and replay share —
a list of engine operations (pydantic models, discriminated on ``op``, saved as JSON) — and
the model of each op: what it means against the engine's current state.

Keeps: every op is an intent interpreted against the current state, so any subsequence of a
valid trace is a valid trace (a shrinker may delete any op): an op whose target does not exist
or has finished is a recorded no-op, a submit whose rid was used before is skipped, and an
engine rejection (HTTP 400: closed or unknown session, too-long prompt, rejected session
parameters, duplicate session id) is the engine's answer, recorded, never a crash. The runner
(trace_run.py) executes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from engine.request import SamplingParams
from invariants.scenarios.spec import EngineSpec

AbortPhase = Literal["waiting", "running", "chunked", "any"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SessionRef(_Strict):
    """``session_params`` of a request (SGLang ``SessionParams``)."""

    id: str
    rid: str | None = None
    offset: int | None = None
    replace: bool | None = None
    drop_previous_output: bool | None = None

    def params(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Submit(_Strict):
    """Queue a request (greedy; ``ignore_eos`` by default so lengths are the trace's)."""

    op: Literal["submit"] = "submit"
    rid: str = Field(min_length=1)
    input_ids: list[Annotated[int, Field(ge=0)]]  # empty: refused (400), as SGLang does
    max_new_tokens: int = Field(ge=1)
    session: SessionRef | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    ignore_eos: bool = True
    min_new_tokens: int = Field(default=0, ge=0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)

    def sampling_params(self) -> SamplingParams:
        """The engine's sampling parameters of this request."""
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            ignore_eos=self.ignore_eos,
            min_new_tokens=min(self.min_new_tokens, self.max_new_tokens),
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
        )


class OpenSession(_Strict):
    """Open a session (``timeout``: seconds of inactivity on the engine's clock)."""

    op: Literal["open_session"] = "open_session"
    sid: str = Field(min_length=1)
    streaming: bool = False
    timeout: float | None = Field(default=None, gt=0)


class CloseSession(_Strict):
    """Close a session: at once, or once its in-flight streaming turn ends."""

    op: Literal["close_session"] = "close_session"
    sid: str


class Abort(_Strict):
    """Abort ``rid``; without one, the ``pick``-th (modulo) unfinished request in ``phase``."""

    op: Literal["abort"] = "abort"
    rid: str | None = None
    phase: AbortPhase = "any"
    pick: int = Field(default=0, ge=0)


class Disconnect(_Strict):
    """The client of ``rid`` goes away (closes its connection): to the scheduler, an abort
    of ``rid`` — sent by the server's front end when it notices, not by the client."""

    op: Literal["disconnect"] = "disconnect"
    rid: str


class Step(_Strict):
    """``n`` scheduler loop iterations."""

    op: Literal["step"] = "step"
    n: int = Field(default=1, ge=1)


class WaitFor(_Strict):
    """Step until every named request has finished (or was never submitted), at most
    ``max_steps`` iterations: the client awaiting its responses."""

    op: Literal["wait_for"] = "wait_for"
    rids: list[str]
    max_steps: int = Field(default=20_000, ge=1)


class Idle(_Strict):
    """Step until the scheduler declares idle (at most ``max_steps`` iterations)."""

    op: Literal["idle"] = "idle"
    max_steps: int = Field(default=100_000, ge=1)


class ForceRetract(_Strict):
    """One iteration with SGLANG_TEST_RETRACT due: a decode of >= 2 requests retracts."""

    op: Literal["force_retract"] = "force_retract"


class FlushCache(_Strict):
    """``/flush_cache``: drop the prefix cache and every session slot (refused unless idle)."""

    op: Literal["flush_cache"] = "flush_cache"


class AdvanceClock(_Strict):
    """Advance the simulated clock (session timeouts are reaped at the next iteration)."""

    op: Literal["advance_clock"] = "advance_clock"
    seconds: float = Field(gt=0)


Op = Annotated[
    Submit
    | OpenSession
    | CloseSession
    | Abort
    | Disconnect
    | Step
    | WaitFor
    | Idle
    | ForceRetract
    | FlushCache
    | AdvanceClock,
    Field(discriminator="op"),
]
OP_ADAPTER: TypeAdapter[Op] = TypeAdapter(Op)


class TraceError(ValueError):
    """A trace file that cannot be read; one ``path: field: reason`` line per problem."""


class Trace(_Strict):
    """A named, seeded engine configuration and the ops to run on it."""

    version: Literal[1] = 1
    name: str = "trace"
    seed: int = 0
    engine: EngineSpec = EngineSpec()
    ops: list[Op] = []

    def save(self, path: str | Path) -> None:
        """Write the trace as JSON (``text``)."""
        Path(path).write_text(self.text(), encoding="utf-8")

    def text(self) -> str:
        """The trace as JSON, one op per line (so diffs and reviews read well)."""
        head = self.model_dump(mode="json", exclude={"ops"})
        ops = ",\n".join(
            "    " + json.dumps(OP_ADAPTER.dump_python(op, mode="json")) for op in self.ops
        )
        return json.dumps(head, indent=2)[:-2] + (
            ',\n  "ops": [\n' + ops + "\n  ]\n}\n" if ops else ',\n  "ops": []\n}\n'
        )

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace written by ``save``; errors name the file and the field."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise TraceError(f"{path}: {exc}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise TraceError(
                "\n".join(
                    f"{path}: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
                )
            ) from None

    def with_ops(self, ops: list[Op]) -> Trace:
        """The same trace with other ops (a shrinker's candidate)."""
        return self.model_copy(update={"ops": list(ops)})


def op_label(op: Op) -> str:
    """A one-line rendering of an op (reports, shrunk reproducers)."""
    fields = OP_ADAPTER.dump_python(op, mode="json", exclude_defaults=True)
    fields.pop("op", None)
    if "input_ids" in fields:
        fields["input_ids"] = f"<{len(fields['input_ids'])} tokens>"
    args = " ".join(f"{k}={v}" for k, v in fields.items())
    return f"{op.op} {args}".rstrip()


__all__ = [
    "OP_ADAPTER",
    "Abort",
    "AdvanceClock",
    "CloseSession",
    "Disconnect",
    "FlushCache",
    "ForceRetract",
    "Idle",
    "Op",
    "OpenSession",
    "SessionRef",
    "Step",
    "Submit",
    "Trace",
    "TraceError",
    "WaitFor",
    "op_label",
]
