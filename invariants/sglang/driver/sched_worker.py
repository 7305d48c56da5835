"""The one fake on the real scheduler's decision path: the model worker. Its forward returns,
per request of the batch, a token drawn from (seed, rid, position) — deterministic, EOS
possible (``eos_prob``) — instead of running a model; everything it hands the scheduler
besides (the KV pools, the request rows, the allocator) is SGLang's own class, built the
way SGLang's model runner builds it for one tiny layer.

Keeps: one seed gives the same tokens run after run, whatever the batching (a token depends
on the request and the position it is sampled at, never on the batch); the worker never
touches KV — the scheduler's accounting is all SGLang's. Runs inside the sglang venv;
imports nothing of kvspec.
"""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import torch
from sched_state import trace_rid

TOKEN_BASE, TOKEN_SPAN = 3, 250  # sampled ids: 3..252 (bytes, never BOS 256 / EOS 257 / PAD)


def token_at(seed: int, rid: str, position: int, eos_id: int, eos_prob: float) -> int:
    """The token a request samples at ``position`` (its KV length when sampled)."""
    draw = zlib.crc32(f"{seed}:{rid}:{position}".encode())
    if eos_prob > 0 and (draw % 1_000_003) / 1_000_003 < eos_prob:
        return eos_id
    return TOKEN_BASE + (draw >> 8) % TOKEN_SPAN


class FakeRunner:
    """What the scheduler and the KV-pool builders read off SGLang's ``ModelRunner``; ``pools``
    are the version's real pool objects (the shim builds them); an attribute nobody set
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
    ``GenerationBatchResult``."""

    def __init__(self, runner: FakeRunner, worker_info: tuple, make_result, tokens: dict) -> None:
        self.model_runner, self.model_config = runner, runner.model_config
        self.worker_info, self.make_result = worker_info, make_result
        self.seed, self.eos_id, self.eos_prob = tokens["seed"], tokens["eos_id"], tokens["eos_prob"]
        self.is_hybrid_swa, self.sliding_window_size = False, None
        self.preloaded_weights_bytes, self.weight_load_time = 0, 0.0
        self.graph_memory_usage, self.graph_time_usage = {}, {}
        self.forwards = 0

    def get_memory_pool(self):
        runner = self.model_runner
        return runner.req_to_token_pool, runner.token_to_kv_pool_allocator

    def get_pad_input_ids_func(self):
        return None

    def get_worker_info(self) -> tuple:
        return self.worker_info

    def forward_batch_generation(self, batch, *args, **kwargs):
        """One token per request of ``batch``: its draw at the batch's sequence length."""
        self.forwards += 1
        seq = batch.seq_lens.tolist()
        tokens = [
            token_at(self.seed, trace_rid(req), int(n), self.eos_id, self.eos_prob)
            for req, n in zip(batch.reqs, seq)
        ]
        return self.make_result(torch.tensor(tokens, dtype=torch.int64))
