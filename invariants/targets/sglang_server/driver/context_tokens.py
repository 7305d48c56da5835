"""The server target's next token: a function of the KV the forward attends to, never of the
request id — so a session turn and a fresh request over the same context get the same answer
(what SGLang's own session tests compare), and a KV mix-up shows in the answer itself.

Keeps: ``context_token`` reads the fingerprints of the attended slots, as the fake worker's
``KVShadow`` holds them ((token + 1) * POSITIONS + position, written by each forward); the
same function over the fingerprints of a token list (``reference``) is the uncached
reference kvspec's ``response.tokens_match_uncached_reference`` compares with. Runs in the
sglang venv (the scheduler process and the server driver); imports nothing of kvspec.
"""

from __future__ import annotations

import zlib
from array import array

TOKEN_BASE, TOKEN_SPAN = 3, 250  # as worker.token_at: 3..252, never BOS 256 / EOS 257
POSITIONS = 1_000_000  # worker.POSITIONS: a fingerprint is (token + 1) * POSITIONS + position


def context_token(seed: int, fingerprints: bytes, eos_id: int, eos_prob: float) -> int:
    """The token sampled after a context whose slots hold ``fingerprints`` (int64 bytes)."""
    draw = zlib.crc32(fingerprints, zlib.crc32(str(seed).encode()))
    if eos_prob > 0 and (draw % 1_000_003) / 1_000_003 < eos_prob:
        return eos_id
    return TOKEN_BASE + (draw >> 8) % TOKEN_SPAN


def fingerprints(tokens: list[int]) -> bytes:
    """What a forward over ``tokens`` leaves in their slots, as int64 bytes."""
    return array("q", [(t + 1) * POSITIONS + p for p, t in enumerate(tokens)]).tobytes()


def reference(seed: int, prompt: list[int], count: int, eos: tuple[int, float]) -> list[int]:
    """The first ``count`` tokens a request over ``prompt`` gets with nothing cached."""
    context, out = list(prompt), []
    for _ in range(count):
        token = context_token(seed, fingerprints(context), *eos)
        out.append(token)
        context.append(token)
    return out


class ContextTokens:
    """Installed on a fake worker (worker.py): its forward writes and reads the KV shadow,
    then samples each request's token from the fingerprints of its ``[0, seq_len)`` slots;
    ``token(rid, position)`` answers the worker's questions about tokens sampled but not yet
    resolved by the scheduler (overlap)."""

    def __init__(self, worker, shadow, cfg: dict) -> None:
        self.worker, self.shadow = worker, shadow
        self.seed, self.eos = cfg["seed"], (cfg["eos_id"], cfg["eos_prob"])
        self.sampled: dict[str, dict[int, int]] = {}  # rid -> position -> token
        worker.shadow = shadow
        worker.token = self.token
        worker.forward_batch_generation = self.forward

    def token(self, rid: str, position: int) -> int:
        return self.sampled[rid][position]

    def forward(self, batch, *args, **kwargs):
        import torch
        from reader import trace_rid

        worker = self.worker
        worker.forwards += 1
        seq = [int(n) for n in batch.seq_lens.tolist()]
        worker.fill_kv(batch, seq)
        rows = batch.req_pool_indices.tolist()
        tokens = []
        for req, row, n in zip(batch.reqs, rows, seq):
            slots = self.shadow.table[row, :n].long()
            attended = self.shadow.slots[slots].numpy().tobytes()
            token = context_token(self.seed, attended, *self.eos)
            self.sampled.setdefault(trace_rid(req), {})[n] = token
            tokens.append(token)
        return worker.make_result(torch.tensor(tokens, dtype=torch.int64))
