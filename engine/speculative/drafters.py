"""EAGLE drafts: a top-1 chain of ``num_steps`` tokens after each request's root token.

Keeps: a draft only proposes — it never writes target KV and never decides a token; the
target's verify decides (so greedy output with speculation equals greedy output without).
Sim model: the seeded acceptance process (``SimModel.draft``: each position is the target's
own next token with probability ``accept_prob``). Tiny model: its distilled draft network
(engine/model/draft.py), chained on its own predicted hidden state from the target's hidden
state that produced the root. Neither keeps a draft KV pool (SGLang's draft pool shares the
target's slot ids, so it costs no allocation beyond the target's reservation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from engine.config.speculative import SpecConfig
from engine.errors import ConfigError
from engine.model.runner import ForwardBatch, ModelRunner


@dataclass(slots=True, eq=False)
class SpecState:
    """One request as the speculative worker (SGLang's GPU side) sees it."""

    req: Any  # the request (its state is dropped once it finished)
    seq_len: int  # KV the worker has verified: positions [0, seq_len) hold accepted tokens
    accept_len: int = 0  # the last verify's accepted drafts + 1 (the bonus)
    hidden: Any = None  # tiny: the target's hidden state that produced the root token


class Drafter(Protocol):
    def propose(
        self, batch: ForwardBatch, states: Sequence[SpecState], num_steps: int
    ) -> np.ndarray:
        """``[bs, num_steps]`` draft tokens after each request's root (``batch.input_ids``)."""
        ...


class SimDrafter:
    """The sim model's seeded draft (acceptance probability ``accept_prob`` per position)."""

    def __init__(self, model: Any, accept_prob: float) -> None:
        self.model, self.accept_prob = model, accept_prob

    def propose(
        self, batch: ForwardBatch, states: Sequence[SpecState], num_steps: int
    ) -> np.ndarray:
        return np.asarray(self.model.draft(batch, num_steps, self.accept_prob), dtype=np.int64)


class TinyDrafter:
    """The tiny model's draft network: ``draft(hidden at t, token at t + 1)`` guesses the
    token at ``t + 2`` and the hidden state at ``t + 1``, which chains the next step."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def propose(
        self, batch: ForwardBatch, states: Sequence[SpecState], num_steps: int
    ) -> np.ndarray:
        import torch

        hidden = torch.stack([s.hidden for s in states])
        tokens = batch.input_ids
        out = np.empty((batch.batch_size, num_steps), dtype=np.int64)
        for j in range(num_steps):
            step = self.model.draft(hidden, tokens)
            out[:, j] = step.token_ids
            hidden, tokens = step.hidden, step.token_ids
        return out


def make_drafter(runner: ModelRunner, spec: SpecConfig) -> Drafter:
    """The draft of ``runner``: the sim model's seeded process or the tiny model's network."""
    from engine.model.sim import SimModel

    if isinstance(runner, SimModel):
        return SimDrafter(runner, spec.accept_prob)
    if hasattr(runner, "draft_network"):  # the tiny model (not imported: it needs torch)
        return TinyDrafter(runner)
    raise ConfigError(
        f"speculative: EAGLE needs a runner with a draft (sim or tiny), not {type(runner).__name__}"
    )
