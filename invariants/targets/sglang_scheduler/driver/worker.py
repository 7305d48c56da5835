"""The one fake on the real scheduler's decision path: the model worker. Its forward returns,
per request of the batch, a token drawn from (seed, rid, position) — deterministic, EOS
possible (``eos_prob``) — instead of running a model; everything it hands the scheduler
besides (the KV pools, the request rows, the allocator) is SGLang's own class, built the
way SGLang's model runner builds it for one tiny layer.

Keeps: one seed gives the same tokens run after run, whatever the batching (a token depends
on the request and the position it is sampled at, never on the batch); the worker never
touches the scheduler's accounting — allocation, commit and release are all SGLang's. With a
``KVShadow`` it also keeps what a real forward would have written into each KV slot, and
checks every slot a forward reads (kvspec's KV integrity, reported as ``forward`` views).
Runs inside the sglang venv; imports nothing of kvspec.
"""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import torch
from reader import trace_rid

TOKEN_BASE, TOKEN_SPAN = 3, 250  # sampled ids: 3..252 (bytes, never BOS 256 / EOS 257 / PAD)
POSITIONS = 1_000_000  # a fingerprint is (token + 1) * POSITIONS + position: read in decimal


def token_at(seed: int, rid: str, position: int, eos_id: int, eos_prob: float) -> int:
    """The token a request samples at ``position`` (its KV length when sampled)."""
    draw = zlib.crc32(f"{seed}:{rid}:{position}".encode())
    if eos_prob > 0 and (draw % 1_000_003) / 1_000_003 < eos_prob:
        return eos_id
    return TOKEN_BASE + (draw >> 8) % TOKEN_SPAN


class KVShadow:
    """The target KV pool as the fake forward would have filled it: per slot, the fingerprint
    of the (token, position) written there. ``read`` checks a request's attended positions
    against the tokens the request has there; each failed read is one record of kvspec's
    ``IntegrityView`` (the first bad position per request and forward)."""

    def __init__(self, table: torch.Tensor, num_slots: int) -> None:
        self.table = table  # SGLang's req_to_token: row, position -> slot
        self.slots = torch.zeros(num_slots, dtype=torch.int64)
        self.failed: list[dict] | None = None  # None: no forward since the last take

    def write(self, row: int, start: int, tokens: list[int]) -> None:
        """A forward wrote ``tokens`` at positions ``[start, start + len(tokens))``."""
        end = start + len(tokens)
        slots = self.table[row, start:end].long()
        self.slots[slots] = fingerprint_tensor(tokens, start)

    def read(self, rid: str, row: int, tokens: list[int]) -> None:
        """A forward attended to positions ``[0, len(tokens))``, believing ``tokens``."""
        failed = self.failed = [] if self.failed is None else self.failed
        slots = self.table[row, : len(tokens)].long()
        found, expected = self.slots[slots], fingerprint_tensor(tokens, 0)
        bad = (found != expected).nonzero()
        if len(bad):
            pos = int(bad[0])
            failed.append(
                dict(
                    rid=rid,
                    position=pos,
                    slot=int(slots[pos]),
                    pool="full",
                    expected=int(expected[pos]),
                    found=int(found[pos]),
                )
            )

    def take(self) -> list[dict] | None:
        """The failed reads since the last take; None when no forward read anything."""
        taken, self.failed = self.failed, None
        return taken


def fingerprint_tensor(tokens: list[int], start: int) -> torch.Tensor:
    """What a forward leaves in the slots of positions ``[start, start + len(tokens))``
    (never 0: a slot holding 0 was never written)."""
    positions = torch.arange(start, start + len(tokens), dtype=torch.int64)
    return (torch.tensor(tokens, dtype=torch.int64) + 1) * POSITIONS + positions


class FakeRunner:
    """What the scheduler and the KV-pool builders read off SGLang's ``ModelRunner``; ``pools``
    are the release's real pool objects (pools.py builds them); an attribute nobody set
    reads None and is recorded in ``defaulted`` (the driver reports them)."""

    def __init__(self, model_config, pools: dict, attrs: dict) -> None:
        self.model_config = model_config
        self.device = "cpu"
        self.model = SimpleNamespace()
        self.forward_stream = torch.cpu.Stream() if hasattr(torch.cpu, "Stream") else None
        self.attn_backend = SimpleNamespace(needs_cpu_seq_lens=True)
        self.__dict__.update(pools)
        self.__dict__.update(attrs)
        self.defaulted: set[str] = set()

    def prewarm_sampling(self) -> None:
        return None

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "defaulted":
            raise AttributeError(name)
        self.defaulted.add(name)
        return None


class FakeWorker:
    """Stands in for ``TpModelWorker``; ``make_result(next_token_ids)`` builds the release's
    ``GenerationBatchResult``; ``shadow`` (set by whoever wants KV integrity checked) sees
    each request's fill written and its prefix read."""

    def __init__(self, runner: FakeRunner, worker_info: tuple, make_result, tokens: dict) -> None:
        self.model_runner, self.model_config = runner, runner.model_config
        self.worker_info, self.make_result = worker_info, make_result
        self.seed, self.eos_id, self.eos_prob = tokens["seed"], tokens["eos_id"], tokens["eos_prob"]
        self.is_hybrid_swa, self.sliding_window_size = False, None
        self.preloaded_weights_bytes, self.weight_load_time = 0, 0.0
        self.graph_memory_usage, self.graph_time_usage = {}, {}
        self.forwards = 0
        self.shadow: KVShadow | None = None

    def get_memory_pool(self):
        runner = self.model_runner
        return runner.req_to_token_pool, runner.token_to_kv_pool_allocator

    def get_pad_input_ids_func(self):
        return None

    def get_worker_info(self) -> tuple:
        return self.worker_info

    def token(self, rid: str, position: int) -> int:
        return token_at(self.seed, rid, position, self.eos_id, self.eos_prob)

    def tokens(self, req, end: int) -> list[int]:
        """The request's tokens at positions ``[0, end)``: its prompt and outputs as the
        scheduler holds them, then (an overlap round not yet resolved) the worker's draws."""
        known = [*req.origin_input_ids, *req.output_ids][:end]
        rid = trace_rid(req)
        return known + [self.token(rid, p) for p in range(len(known), end)]

    def forward_batch_generation(self, batch, *args, **kwargs):
        """One token per request of ``batch``: its draw at the batch's sequence length."""
        self.forwards += 1
        seq = batch.seq_lens.tolist()
        if self.shadow is not None:
            self.fill_kv(batch, seq)
        tokens = [self.token(trace_rid(req), int(n)) for req, n in zip(batch.reqs, seq)]
        return self.make_result(torch.tensor(tokens, dtype=torch.int64))

    def fill_kv(self, batch, seq: list[int]) -> None:
        """What the forward reads and writes: each request attends to ``[0, prefix)`` and
        writes ``[prefix, seq_len)`` (a decode: its one input token at ``seq_len - 1``)."""
        extend = batch.forward_mode.is_extend()
        prefixes = batch.prefix_lens if extend else [n - 1 for n in seq]
        rows = batch.req_pool_indices.tolist()
        for req, row, prefix, end in zip(batch.reqs, rows, prefixes, seq):
            tokens = self.tokens(req, int(end))
            self.shadow.read(trace_rid(req), row, tokens[: int(prefix)])
            self.shadow.write(row, int(prefix), tokens[int(prefix) :])

    def take_integrity(self) -> list[dict] | None:
        """The failed KV reads of the forwards since the last take (None: not checked, or no
        forward ran)."""
        return None if self.shadow is None else self.shadow.take()
