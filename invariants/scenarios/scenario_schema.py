"""The workload part of a scenario spec (specs/*.yaml ``workload:``): plain traffic, streaming and
non-streaming sessions, length distributions and faults. scenario.py turns one into ops,
deterministically from the spec's seed.

Keeps: a workload that validates is generatable — lengths are positive ranges, fault rates
are probabilities, a non-streaming session's branch weights are not all zero. Plain-traffic
keys (requests, system_prompts, suffix, gen, arrivals_per_step) keep their old meaning, so
specs written before sessions existed load and run the same trace.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

AbortPhase = Literal["waiting", "running", "chunked", "any"]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _as_dist(value: Any) -> Any:
    """``[lo, hi]`` is shorthand for ``{uniform: [lo, hi]}``."""
    return {"uniform": value} if isinstance(value, (list, tuple)) else value


class Dist(_Strict):
    """A length distribution: ``[lo, hi]`` / ``{uniform: [lo, hi]}`` (inclusive),
    ``{loguniform: [lo, hi]}`` (long-tailed: most short, a few long) or ``{choice: [a, b]}``."""

    uniform: tuple[int, int] | None = None
    loguniform: tuple[int, int] | None = None
    choice: list[Annotated[int, Field(ge=1)]] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Dist:
        kinds = [k for k in ("uniform", "loguniform", "choice") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"give exactly one of uniform, loguniform, choice (got {kinds or 'none'})"
            )
        span = self.uniform or self.loguniform
        if span is not None and not 1 <= span[0] <= span[1]:
            raise ValueError(f"range {list(span)} must satisfy 1 <= lo <= hi")
        if self.choice is not None and not self.choice:
            raise ValueError("choice needs at least one value")
        return self

    @property
    def high(self) -> int:
        span = self.uniform or self.loguniform
        return span[1] if span is not None else max(self.choice or [1])


Length = Annotated[Dist, BeforeValidator(_as_dist)]


class BranchWeights(_Strict):
    """How a non-streaming session's next turn attaches (weights, SGLang §4.4):
    ``append`` to the last turn; ``branch`` from an earlier turn; ``backtrack`` = last turn with
    ``offset: -1, replace: true`` (test_session_control); ``drop_output`` = last turn with
    ``drop_previous_output``; ``new_root`` = no parent (``rid: null``)."""

    append: float = Field(default=1.0, ge=0)
    branch: float = Field(default=0.0, ge=0)
    backtrack: float = Field(default=0.0, ge=0)
    drop_output: float = Field(default=0.0, ge=0)
    new_root: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _some_weight(self) -> BranchWeights:
        if not any(self.model_dump().values()):
            raise ValueError("at least one branch weight must be > 0")
        return self


class SessionsSpec(_Strict):
    """Sessions run in waves of ``concurrency``: a wave opens its sessions, sends one turn of
    each at once per round (plus ``plain_per_round`` non-session requests), awaits them, and
    after ``turns`` rounds closes them."""

    streaming: int = Field(
        default=0, ge=0
    )  # streaming sessions (needs engine.enable_streaming_session)
    plain: int = Field(default=0, ge=0)  # non-streaming sessions (session control)
    turns: int = Field(default=3, ge=1)
    concurrency: int = Field(default=4, ge=1)
    first_prompt: Length | None = (
        None  # turn 1's tokens after a shared system prompt; default: prompt
    )
    prompt: Length = Dist(uniform=(8, 64))  # tokens a turn appends
    gen: Length = Dist(uniform=(4, 16))
    plain_per_round: int = Field(default=0, ge=0)
    timeout: float | None = Field(default=None, gt=0)  # seconds of inactivity (simulated clock)
    logprob: Probability = 0.0  # chance a turn asks for logprobs
    continuing: Probability = 0.0  # chance a later turn is a bare "continue" (BOS alone)
    branch: BranchWeights = BranchWeights()

    @property
    def total(self) -> int:
        return self.streaming + self.plain


class FaultsSpec(_Strict):
    """Faults, each a per-turn (or per-request) probability unless said otherwise."""

    too_long: Probability = 0.0  # an input over the context length: aborted with 400 before memory
    rejected_params: Probability = (
        0.0  # streaming offset/replace/drop, unknown parent, bad logprob start: 400
    )
    mid_abort: Probability = 0.0  # aborted by rid 0..gen+chunks steps after submit (any phase)
    close_in_flight: Probability = 0.0  # a session closed while its turn runs (deferred close)
    timeout: Probability = (
        0.0  # a session then left idle past its timeout (reaped); needs sessions.timeout
    )
    abort_storm: int = Field(
        default=0, ge=0
    )  # per round: this many aborts of a random phase and request
    storm_phases: list[AbortPhase] = ["waiting", "running", "chunked", "any"]
    retract: Probability = 0.0  # chance a round forces a retract while its turns run
    flush: Probability = 0.0  # chance the cache is flushed at the idle point after a round


class WorkloadSpec(_Strict):
    """Plain traffic (shared system prompts + random suffixes, byte tokens), then sessions."""

    requests: int = Field(default=64, ge=0)
    system_prompts: int = Field(default=4, ge=1)
    system_prompt_len: int = Field(default=32, ge=0)
    suffix: Length = Dist(uniform=(8, 128))
    gen: Length = Dist(uniform=(4, 32))
    arrivals_per_step: int | None = Field(default=None, ge=1)  # None: every request at step 0
    # a request's chance of asking for SGLang's penalizers (min_new_tokens, frequency and
    # presence penalties; EOS then ends it): drawn from a stream of its own, so 0 leaves
    # every other draw of the trace as it was
    penalized: Probability = 0.0
    sessions: SessionsSpec = SessionsSpec()
    faults: FaultsSpec = FaultsSpec()


OracleName = Literal["lengths", "rejections", "session_prompts"]
ORACLES: tuple[OracleName, ...] = ("lengths", "rejections", "session_prompts")
