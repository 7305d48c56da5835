"""Req, SamplingParams and FinishReason: one generation request and the KV fields SGLang's
accounting is written in (``managers/schedule_batch.py::Req``).

Keeps: ``kv_committed_len <= kv_allocated_len``; each of the two KV ranges is released at
most once (``pop_*`` flags); a request is finished exactly once (``finished_reason`` is set
once and never cleared). The KV fields — the row (``req_pool_idx``) and the lengths
``kv_committed_len``, ``kv_allocated_len``, ``cache_protected_len``, ``swa_evicted_seqlen`` —
are written only by the memory layer (engine/memory.py: match, allocation, SWA eviction,
release, the reset after a retract; the prefix caches of engine/cache/, the streaming
cache's slot lending among them) and EAGLE's accounting (engine/speculative/accounting.py);
tests/engine/test_kv_field_writers.py holds the engine to it. This file writes the
scheduling fields: fill ids and extend length (``init_next_round_input``), cached-token
accounting (``prepare_for_extend``), the retract reset. Field names are SGLang's so
invariants transfer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from engine.errors import ConfigError, KVAccountingError

if TYPE_CHECKING:
    from collections.abc import Collection

EMPTY_INDICES = np.empty(0, dtype=np.int64)

FinishKind = Literal["length", "stop", "abort"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What a request asks for. ``temperature == 0`` is greedy (the only mode the
    deterministic models implement; a positive temperature is stored and passed through).
    The penalizers (``min_new_tokens``, frequency and presence penalties) change the greedy
    token: engine/model/penalties.py."""

    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    temperature: float = 0.0
    stop_strs: tuple[str, ...] = ()  # byte-level text: matched against the output's bytes
    min_new_tokens: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens={self.max_new_tokens}: must be >= 0")
        if self.temperature < 0:
            raise ConfigError(f"temperature={self.temperature}: must be >= 0")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:  # SGLang's verify()
            raise ConfigError(
                f"min_new_tokens={self.min_new_tokens}: must be in [0, max_new_tokens="
                f"{self.max_new_tokens}]"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ConfigError(f"{name}={getattr(self, name)}: must be in [-2, 2]")

    @property
    def is_penalized(self) -> bool:
        """Whether a penalizer changes this request's scores (the models' slow path)."""
        return bool(self.min_new_tokens or self.frequency_penalty or self.presence_penalty)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class FinishReason:
    """Why a request finished: ``length`` (max_new_tokens reached), ``stop`` (a stop or EOS
    token matched) or ``abort`` (with a message and, where an HTTP answer follows, a status)."""

    kind: FinishKind
    length: int | None = None
    matched: int | str | None = None  # a stop token id, or a stop string
    message: str | None = None
    status_code: int | None = None

    @classmethod
    def of_length(cls, length: int) -> FinishReason:
        return cls("length", length=length)

    @classmethod
    def of_stop(cls, matched: int | str) -> FinishReason:
        return cls("stop", matched=matched)

    @classmethod
    def of_abort(cls, message: str, status_code: int | None = None) -> FinishReason:
        return cls("abort", message=message, status_code=status_code)

    def to_json(self) -> dict[str, Any]:
        """SGLang's ``finish_reason`` object of a response."""
        if self.kind == "length":
            return {"type": "length", "length": self.length}
        if self.kind == "stop":
            return {"type": "stop", "matched": self.matched}
        return {"type": "abort", "message": self.message, "status_code": self.status_code}


class PrefixMatcher(Protocol):
    """What ``init_next_round_input`` needs from the memory layer (``KVMemory``)."""

    def match_prefix(self, req: Req) -> None: ...


@dataclass(slots=True, eq=False)
class Req:
    """A request: its tokens, its request row, the lengths of its KV ranges, its fate."""

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    fill_ids: list[int] = field(default_factory=list)
    extra_key: str | None = None
    # (session id, generation): a finished turn tags the tree (--enable-session-radix-cache)
    session_tag: tuple[str, int] | None = None
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    eos_token_ids: frozenset[int] = frozenset()
    return_logprob: bool = False
    output_token_logprobs: list[float] = field(default_factory=list)  # only with return_logprob
    # with return_logprob: the prompt positions [logprob_start_len, len(origin)) get their
    # logprobs (SGLang's input_token_logprobs; the default start is the prompt's end: none)
    logprob_start_len: int = -1
    input_token_logprobs: list[float] = field(default_factory=list)
    # KV ownership
    prefix_indices: np.ndarray = field(default_factory=lambda: EMPTY_INDICES)
    req_pool_idx: int | None = None
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    kv_committed_freed: bool = False
    kv_overallocated_freed: bool = False
    cache_protected_len: int = 0
    last_node: Any = None
    swa_uuid_for_lock: int | None = None
    swa_evicted_seqlen: int = 0
    is_chunked: int = 0
    # scheduling
    extend_input_len: int = 0
    already_computed: int = 0
    cached_tokens: int = 0
    decode_batch_idx: int = 0
    is_retracted: bool = False
    retracted_stain: bool = False
    retraction_count: int = 0
    # fate
    to_finish: FinishReason | None = None
    finished_reason: FinishReason | None = None
    finished_len: int | None = None

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def all_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def finished(self) -> bool:
        return self.finished_reason is not None

    def append_output(self, token: int, logprob: float) -> None:
        """One sampled token (and, when the request asked for them, its logprob)."""
        self.output_ids.append(token)
        if self.return_logprob:
            self.output_token_logprobs.append(logprob)

    def take_input_logprobs(self, values: Sequence[float] | np.ndarray, first: int) -> None:
        """A forward's logprobs of the written positions ``first, first + 1, …``: keep those
        of prompt positions not yet taken (chunks continue; a re-prefill adds nothing)."""
        have, end = (
            self.logprob_start_len + len(self.input_token_logprobs),
            len(self.origin_input_ids),
        )
        for position, value in enumerate(values, start=first):
            if position == have and position < end:
                self.input_token_logprobs.append(float(value))
                have += 1

    # ---- lifecycle ----

    def init_next_round_input(self, matcher: PrefixMatcher | None = None) -> None:
        """Fill ids = prompt + output; with a matcher, match the cache (the matcher keeps
        the one-token logit reserve: prefix <= len(fill_ids) - 1); then the extend length.
        Without one (a continuing chunk) the prefix is what the last chunk left."""
        self.fill_ids = self.origin_input_ids + self.output_ids
        if matcher is not None:
            matcher.match_prefix(self)
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)

    def prepare_for_extend(self, prefix_len: int) -> None:
        """Bookkeeping after the extend's KV was allocated (``committed = allocated =
        seq_len`` was written by ``KVMemory.alloc_for_extend``): cached-token accounting,
        counted once per token unless the request was ever retracted."""
        seq_len = len(self.fill_ids)
        if seq_len - prefix_len != self.extend_input_len:
            raise KVAccountingError(
                f"req {self.rid}: extend {seq_len - prefix_len} != "
                f"extend_input_len {self.extend_input_len}"
            )
        if not self.retracted_stain:
            self.cached_tokens += prefix_len - self.already_computed
        self.already_computed = seq_len
        self.is_retracted = False

    def reset_for_retract(self) -> None:
        """The scheduling fields of a retracted request back to a fresh prefill (its KV
        fields are reset by the memory layer: ``KVMemory.reset_retracted``); the tokens are
        kept so the next prefill recomputes ``origin + output``."""
        self.extend_input_len = 0
        self.already_computed = 0
        self.is_chunked = 0
        self.is_retracted = self.retracted_stain = True
        self.retraction_count += 1

    def check_finished(self) -> None:
        """Set ``finished_reason`` after a token was appended (SGLang's order: a pending
        abort, then the length limit, then stop/EOS tokens unless ``ignore_eos``)."""
        if self.finished():
            return
        if self.to_finish is not None:
            self.finished_reason, self.to_finish = self.to_finish, None
            self.finished_len = len(self.output_ids)
            return
        params = self.sampling_params
        if len(self.output_ids) >= params.max_new_tokens:
            self.finished_reason = FinishReason.of_length(params.max_new_tokens)
            self.finished_len = params.max_new_tokens
            return
        last = self.output_ids[-1]
        if not params.ignore_eos and _matches(last, params.stop_token_ids, self.eos_token_ids):
            self.finished_reason = FinishReason.of_stop(last)
            self.finished_len = len(self.output_ids)
            return
        matched = _stop_str(self.output_ids, params.stop_strs)
        if matched is not None:  # SGLang's FINISH_MATCHED_STR (the text is trimmed by the API)
            self.finished_reason = FinishReason.of_stop(matched)
            self.finished_len = len(self.output_ids)

    def set_finish_with_abort(self, message: str, status_code: int | None = 400) -> None:
        """Finish now, before any KV is touched (input validation, waiting-queue abort)."""
        self.finished_reason = FinishReason.of_abort(message, status_code)
        self.finished_len = len(self.output_ids)

    # ---- release (exactly once per range) ----

    def pop_committed_kv_cache(self) -> int:
        """The committed length, marking the committed range released (once)."""
        if self.kv_committed_freed:
            raise KVAccountingError(
                f"req {self.rid}: committed KV released twice ({self.kv_committed_len=})"
            )
        self.kv_committed_freed = True
        return self.kv_committed_len

    def pop_overallocated_kv_cache(self) -> tuple[int, int]:
        """(committed, allocated), marking the over-allocated tail released (once)."""
        if self.kv_overallocated_freed:
            raise KVAccountingError(f"req {self.rid}: over-allocated KV released twice")
        self.kv_overallocated_freed = True
        return self.kv_committed_len, self.kv_allocated_len


def _matches(token: int, stop_ids: Collection[int], eos_ids: Collection[int]) -> bool:
    return token in stop_ids or token in eos_ids


def _stop_str(output_ids: list[int], stops: tuple[str, ...]) -> str | None:
    """The stop string the output's bytes now end with (ids are bytes below 256: the byte
    tokenizer), if any."""
    for stop in stops:
        want = stop.encode("utf-8")
        tail = output_ids[-len(want) :] if want else []
        if want and len(tail) == len(want) and bytes(t if t < 256 else 0 for t in tail) == want:
            return stop
    return None


Release = Callable[[Req], None]  # the scheduler's hand-back of a finished request's KV
