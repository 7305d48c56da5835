"""The EAGLE draft network of the tiny model: target hidden state + token embedding in,
draft token out — one fitted layer ``fc([norm(embed(token)) | hidden | 1])`` followed by the
target's final norm and LM head (EAGLE shares the embedding and head with the target).

Keeps: the draft is a pure function of the seed: its ``fc`` is distilled in closed form
(ridge regression) from the target's own greedy self-play on seeded prompts, predicting the
target's next hidden state. A random draft would almost never agree with the target (about
0 % measured); the fitted one agrees about 30-35 % of the time on held-out text, so EAGLE
sees every accept length from 0 to ``num_draft``. The draft reads no KV (it chains on its own
predicted hidden state), so it needs no draft KV pool; EAGLE drives it through
engine/speculative/drafters.py.

Self-play samples (step ``s`` of request ``b``; step 0 is the prefill)::

    hidden[s, b]  -> the target sampled tokens[s, b] from it
    (hidden[s, b], tokens[s, b])  ->  hidden[s + 1, b]     one regression sample
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from engine.config.model import TinyConfig
from engine.model.runner import ForwardMode, ModelRunner
from engine.model.scratch import scratch_batch, slot_table
from engine.model.tiny_layers import TinyWeights, rms_norm
from engine.request import Req

RIDGE = 1.0
SELF_PLAY = (32, 4, 24, 32)  # prompts, shortest prompt, longest prompt, decode steps


class DraftOutput(NamedTuple):
    token_ids: np.ndarray  # int64 [n]: the draft's greedy token after each (hidden, token)
    logprobs: np.ndarray  # float64 [n]: the draft's logprob of that token
    hidden: torch.Tensor  # [n, H]: the draft's predicted hidden state (chains the next draft)


class SelfPlay(NamedTuple):
    hidden: torch.Tensor  # [n, H]: the target's state at position t
    tokens: np.ndarray  # int64 [n]: the token it sampled (position t + 1)
    next_hidden: torch.Tensor  # [n, H]: the target's state at position t + 1


class DraftNetwork:
    """``draft(hidden, token) = argmax lm_head(final_norm(fc(features)))``."""

    def __init__(self, cfg: TinyConfig, target: TinyWeights, fc: torch.Tensor) -> None:
        self.cfg, self.target = cfg, target
        self.fc = fc.to(target.embed.dtype)  # [2H + 1, H]

    @classmethod
    def distill(cls, cfg: TinyConfig, target: TinyWeights, play: SelfPlay) -> DraftNetwork:
        """Fit ``fc`` by ridge regression of ``next_hidden`` on the features (float64)."""
        a = _features(cfg, target, play.hidden, play.tokens).double()  # [n, 2H + 1]
        b = play.next_hidden.double()  # [n, H]
        eye = torch.eye(a.shape[1], dtype=torch.float64, device=a.device)
        return cls(cfg, target, torch.linalg.solve(a.T @ a + RIDGE * eye, a.T @ b))

    def draft(self, hidden: torch.Tensor, token_ids: np.ndarray | torch.Tensor) -> DraftOutput:
        """``hidden [n, H]`` (the target's state at position t) and ``token_ids [n]`` (the
        token at t + 1) -> the draft's guess of the token at t + 2."""
        t = self.target
        x = _features(self.cfg, t, hidden.to(t.embed.dtype), token_ids) @ self.fc  # [n, H]
        out = rms_norm(x, t.final_norm, self.cfg.rms_norm_eps)
        logp = torch.log_softmax((out @ t.lm_head).to(torch.float64), dim=-1)  # [n, V]
        best = logp.argmax(dim=-1)
        lp = logp.gather(-1, best[:, None])[:, 0]
        return DraftOutput(best.cpu().numpy().astype(np.int64), lp.cpu().numpy(), out)


def _features(
    cfg: TinyConfig, target: TinyWeights, hidden: torch.Tensor, token_ids: np.ndarray | torch.Tensor
) -> torch.Tensor:
    """``[norm(embed(token)) | hidden | 1]``: ``[n, 2H + 1]``."""
    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64), device=target.embed.device)
    ones = torch.ones_like(target.final_norm)
    emb = rms_norm(target.embed[ids], ones, cfg.rms_norm_eps)  # [n, H]
    bias = torch.ones(len(ids), 1, dtype=emb.dtype, device=emb.device)
    return torch.cat([emb, hidden, bias], dim=-1)


def self_play(runner: ModelRunner, seed: int) -> SelfPlay:
    """Greedy generations of ``runner`` (over a scratch pool of ``self_play_slots()``
    slots, page size 1) from seeded byte prompts; returns the regression samples."""
    num, low, high, steps = SELF_PLAY
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 256, int(rng.integers(low, high + 1))).tolist() for _ in range(num)]
    table = slot_table(num, high + steps + 1)
    reqs = [Req(f"draft-self-play-{b}", p) for b, p in enumerate(prompts)]
    lens = np.array([len(p) for p in prompts], dtype=np.int64)
    ids = np.concatenate([np.asarray(p, dtype=np.int64) for p in prompts])
    prefill = scratch_batch(ForwardMode.EXTEND, reqs, ids, np.zeros(num, np.int64), lens, table)
    out = runner.forward(prefill)
    hidden, tokens = [out.hidden_states], [out.next_token_ids]
    for s in range(steps):
        ones = np.ones(num, dtype=np.int64)
        out = runner.forward(
            scratch_batch(ForwardMode.DECODE, reqs, tokens[-1], lens + s, ones, table)
        )
        hidden.append(out.hidden_states)
        tokens.append(out.next_token_ids)
    h = torch.stack(hidden)  # [steps + 1, num, H]
    return SelfPlay(
        h[:-1].reshape(-1, h.shape[-1]),
        np.stack(tokens[:-1]).reshape(-1),
        h[1:].reshape(-1, h.shape[-1]),
    )


def self_play_slots() -> int:
    """KV slots the scratch pool of ``self_play`` needs (slot 0 is padding)."""
    num, _, high, steps = SELF_PLAY
    return num * (high + steps + 1)
