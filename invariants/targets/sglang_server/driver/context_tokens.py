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

from worker import POSITIONS, TOKEN_BASE, TOKEN_SPAN  # the shadow's fingerprints, the ids


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
    """Installed on a fake worker (worker.py) in place of its seeded draws: each forward
    writes the fingerprint of every token it is fed (``input_ids``) into the slot SGLang gave
    it (``out_cache_loc``), then samples each request's token from the fingerprints of the
    slots its row names for ``[0, seq_len)`` — what attention would read. Only the fields
    every release's forward batch has are read (no request objects: 0.5.1x hands the worker a
    ``ModelWorkerBatch`` without them)."""

    def __init__(self, worker, slots, cfg: dict) -> None:
        self.worker, self.slots = worker, slots  # slots: int64 tensor, one per KV slot
        self.seed, self.eos = cfg["seed"], (cfg["eos_id"], cfg["eos_prob"])
        self.table = worker.model_runner.req_to_token_pool.req_to_token
        worker.forward_batch_generation = self.forward

    def forward(self, batch, *args, **kwargs):
        import torch

        self.worker.forwards += 1
        seq = [int(n) for n in batch.seq_lens.tolist()]
        fed = fed_lengths(batch, seq)
        positions = [p for n, k in zip(seq, fed) for p in range(n - k, n)]
        ids = batch.input_ids.long()[: len(positions)]
        written = (ids + 1) * POSITIONS + torch.tensor(positions, dtype=torch.int64)
        self.slots[batch.out_cache_loc.long()[: len(positions)]] = written
        rows = batch.req_pool_indices.tolist()
        tokens = [self.sample(row, n) for row, n in zip(rows, seq)]
        return self.worker.make_result(torch.tensor(tokens, dtype=torch.int64))

    def sample(self, row: int, length: int) -> int:
        attended = self.slots[self.table[row, :length].long()]
        return context_token(self.seed, attended.numpy().tobytes(), *self.eos)


def fed_lengths(batch, seq: list[int]) -> list[int]:
    """Tokens each request is fed this forward: its extend length (a mixed batch's decoding
    requests: 1), or 1 in a decode."""
    if not batch.forward_mode.is_extend():
        return [1] * len(seq)
    found = getattr(batch, "extend_seq_lens", None)
    found = found if found is not None else batch.extend_lens
    return [int(n) for n in (found.tolist() if hasattr(found, "tolist") else found)]
