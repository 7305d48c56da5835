"""The scheduler → model contract: ForwardBatch in, ForwardOutput out (docs/design.md decision 7).

Keeps: a ForwardBatch names every KV slot the forward writes (``out_cache_loc``) and every
request row it reads; a model reads KV only through ``req_to_token`` rows, so a wrong row or
a freed slot shows up as wrong KV, never as a silently recomputed right answer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from engine.request import Req


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill / chunked prefill (possibly with a cached prefix)
    DECODE = "decode"  # one token per request
    MIXED = "mixed"  # a chunked prefill riding with the decode batch
    DRAFT_EXTEND = "draft_extend"  # EAGLE: the draft's input (each request's root token)
    TARGET_VERIFY = "target_verify"  # EAGLE: target over [root, drafts], an output per token

    @property
    def is_extend(self) -> bool:
        """A prefill batch (decodes may ride along): its requests' prompts are extended."""
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)


@dataclass(slots=True, eq=False)
class ForwardBatch:
    """One forward. Per-request arrays are ``[bs]``; per-token arrays ``[num_tokens]``,
    request-major: request i's tokens are ``extend_lens[i]`` consecutive entries, at
    positions ``prefix_lens[i] .. seq_lens[i] - 1``."""

    mode: ForwardMode
    reqs: list[Req]
    input_ids: np.ndarray  # int64 [num_tokens]: tokens whose KV this forward writes
    positions: np.ndarray  # int64 [num_tokens]
    out_cache_loc: np.ndarray  # int64 [num_tokens]: full-pool slots written
    req_pool_indices: np.ndarray  # int64 [bs]
    prefix_lens: np.ndarray  # int64 [bs]: KV already present before this forward
    extend_lens: np.ndarray  # int64 [bs]: tokens written now (1 per request in decode)
    seq_lens: np.ndarray  # int64 [bs]: prefix_lens + extend_lens
    req_to_token: np.ndarray  # the request → slot table (int32 [rows, max_context])
    swa_out_cache_loc: np.ndarray | None = None  # SWA slots written (hybrid pools)
    return_logprob: list[bool] = field(default_factory=list)
    logprob_start_lens: list[int] = field(default_factory=list)
    sample: list[bool] = field(default_factory=list)  # False: a non-final chunk samples nothing

    @property
    def batch_size(self) -> int:
        return len(self.reqs)


@dataclass(slots=True, eq=False)
class ForwardOutput:
    """What the model returns: one next token per request (ignored where not sampled); for
    TARGET_VERIFY one per input token (the target's token after each), for EAGLE's greedy
    acceptance."""

    next_token_ids: np.ndarray  # int64 [bs] (TARGET_VERIFY: [num_tokens])
    next_token_logprobs: np.ndarray  # float64 [bs]
    input_token_logprobs: list[np.ndarray | None] = field(default_factory=list)
    hidden_states: Any = None  # EAGLE: the target's last hidden state per token


class ModelRunner(Protocol):
    """Anything that turns a ForwardBatch into next tokens (sim, tiny, an adapter)."""

    def forward(self, batch: ForwardBatch) -> ForwardOutput: ...
