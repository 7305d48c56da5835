"""vLLM 0.33.0's Scheduler built as its own tests build it (tests/v1/core/utils.py
``create_scheduler`` / ``create_requests``), from a local one-layer config.json (no model hub)
and a fake KV cache config of ``num_blocks`` blocks: one full-attention group, or (a
``sliding_window``) a full group and a sliding-window group over the same block pool, which
makes vLLM's HybridKVCacheCoordinator (tests/v1/core/test_prefix_caching.py's hybrid
configs); a config op's ``kv_groups`` lays out more (MLA, chunked-local, several groups per
spec, groups of different block sizes). ``async_scheduling`` builds the AsyncScheduler
(tests/v1/core/test_async_scheduler.py)."""

from __future__ import annotations

import json
import os

import torch
from connector import transfer_config
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

EOS_TOKEN_ID = 2
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
    "vocab_size": 1024,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": EOS_TOKEN_ID,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
}
init_none_hash(sha256)


def build_scheduler(op: dict, model_dir: str) -> Scheduler:
    """A fresh scheduler of one config op, built as vLLM's tests build one (tests/v1/core)."""
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(TINY_LLAMA, f)
    config = vllm_config(op, model_dir)
    kv = KVCacheConfig(
        num_blocks=op["num_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=kv_groups(op),
    )
    config.cache_config.num_gpu_blocks = op["num_blocks"]
    # vLLM's CPU platform turns async scheduling off (nothing to overlap on a CPU); its tests
    # build the AsyncScheduler directly, as here, and the flag is put back to match
    config.scheduler_config.async_scheduling = bool(op.get("async_scheduling"))
    kind = AsyncScheduler if op.get("async_scheduling") else Scheduler
    size, hash_size = block_sizes(kv, config)
    sizes = {"hash_block_size": hash_size} if hash_size != size else {}
    return kind(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=size,
        log_stats=True,
        **sizes,
    )


def vllm_config(op: dict, model_dir: str) -> VllmConfig:
    """The model, scheduler, cache, (EAGLE) speculative and KV-transfer (the seeded connector:
    connector.py) configs of one config op."""
    model = ModelConfig(
        model=model_dir,
        dtype="float32",
        seed=42,
        skip_tokenizer_init=True,
        max_model_len=op["max_model_len"],
    )
    sched = SchedulerConfig(
        max_num_seqs=op["max_num_seqs"],
        max_num_batched_tokens=op["max_num_batched_tokens"],
        max_model_len=op["max_model_len"],
        long_prefill_token_threshold=0,
        enable_chunked_prefill=True,
        async_scheduling=bool(op.get("async_scheduling")),
        is_encoder_decoder=model.is_encoder_decoder,
    )
    cache = CacheConfig(
        block_size=op["block_size"],
        cache_dtype="auto",
        enable_prefix_caching=op["prefix_caching"],
        mamba_cache_mode=mamba_mode(op) or "none",
    )
    speculative = eagle_config(op.get("num_speculative_tokens") or 0, model, model_dir)
    return VllmConfig(
        scheduler_config=sched,
        model_config=model,
        cache_config=cache,
        speculative_config=speculative,
        kv_transfer_config=transfer_config(op.get("connector")),
        device_config=DeviceConfig(device="cpu"),  # what VLLM_TARGET_DEVICE says, for releases
    )  # that do not read it (0.27 and older): vLLM's connector tests pass it so


def eagle_config(k: int, target: ModelConfig, model_dir: str) -> SpeculativeConfig | None:
    """EAGLE with ``k`` draft tokens over a local one-layer draft config (never loaded: the
    runner is fake), so the scheduler reserves vLLM's ``num_lookahead_tokens`` (= k) slots
    per request for the drafts the proposer writes; None without speculation."""
    if not k:
        return None
    draft = os.path.join(model_dir, "draft")
    os.makedirs(draft, exist_ok=True)
    with open(os.path.join(draft, "config.json"), "w") as f:
        json.dump(TINY_LLAMA, f)
    return SpeculativeConfig(
        method="eagle",
        model=draft,
        num_speculative_tokens=k,
        target_model_config=target,
        target_parallel_config=ParallelConfig(),
    )


def mamba_mode(op: dict) -> str | None:
    """A Mamba group's cache mode: ``align`` under prefix caching (vLLM caches Mamba states
    only block-aligned; MambaManager refuses prefix caching otherwise), else ``none``."""
    if not op.get("mamba_group"):
        return None
    return "align" if op["prefix_caching"] else "none"


def kv_groups(op: dict) -> list[KVCacheGroupSpec]:
    """``full_copies`` full-attention groups (MLA's spec with ``attention: mla``), then
    ``copies`` groups of each local spec the op sets (vLLM splits a hybrid model's layers
    into groups of equal size, so groups share one spec): sliding window (at
    ``local_block_size``), chunked-local, and Mamba (its spec as vLLM's ``MambaBase`` makes
    it: a state per block, a block per draft token, the cache mode of ``mamba_mode``)."""
    layout = op.get("kv_groups") or {}
    size, copies = op["block_size"], layout.get("copies", 1)
    shape = dict(num_kv_heads=1, head_size=1, dtype=torch.float32)
    full = MLAAttentionSpec if layout.get("attention") == "mla" else FullAttentionSpec
    local: list[tuple[str, object]] = []
    if window := op.get("sliding_window"):
        swa_size = layout.get("local_block_size") or size
        local.append(
            ("swa", SlidingWindowSpec(block_size=swa_size, **shape, sliding_window=window))
        )
    if chunk := layout.get("chunked_local"):
        spec = ChunkedLocalAttentionSpec(block_size=size, **shape, attention_chunk_size=chunk)
        local.append(("chunked", spec))
    if mamba := mamba_mode(op):
        state = MambaSpec(
            block_size=size,
            shapes=((1,), (1,)),
            dtypes=(torch.float32,),
            mamba_cache_mode=mamba,
            num_speculative_blocks=op.get("num_speculative_tokens") or 0,
        )
        local.append(("mamba", state))
    full_spec = full(block_size=size, **shape)
    groups = [
        KVCacheGroupSpec([f"full{i}"], full_spec) for i in range(layout.get("full_copies", 1))
    ]
    for name, spec in local:
        groups += [KVCacheGroupSpec([f"{name}{i}"], spec) for i in range(copies)]
    return groups


def block_sizes(kv: KVCacheConfig, config: VllmConfig) -> tuple[int, int]:
    """The scheduler's block size and its block hashes' (vLLM's engine core resolves them
    from the groups: their least common multiple and greatest common divisor); one block size
    for every group where the release predates groups of different block sizes."""
    sizes = {g.kv_cache_spec.block_size for g in kv.kv_cache_groups}
    if len(sizes) == 1:
        size = sizes.pop()
        return size, size
    # an ImportError here is drift: the release predates groups of different block sizes
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    return resolve_kv_cache_block_sizes(kv, config)


def make_request(
    rid: str,
    prompt: list[int],
    max_tokens: int,
    ignore_eos: bool,
    block_size: int,
    min_tokens: int = 0,
) -> Request:
    """``min_tokens``: the fake runner samples no EOS before it, as vLLM's sampler does."""
    params = SamplingParams(ignore_eos=ignore_eos, max_tokens=max_tokens, min_tokens=min_tokens)
    params.update_from_generation_config({}, eos_token_id=EOS_TOKEN_ID)
    hasher = get_request_block_hasher(block_size, sha256)
    return Request(
        request_id=rid,
        prompt_token_ids=list(prompt),
        sampling_params=params,
        pooling_params=None,
        block_hasher=hasher,
    )


def instrument(sched: Scheduler, counts: dict, block_size: int) -> None:
    """What the goals read: tokens the prefix cache evicted, and its hit tokens."""
    count_evictions(sched.kv_cache_manager.coordinator.block_pool, counts, block_size)
    count_hits(sched.kv_cache_manager, counts)


def count_evictions(pool, counts: dict, block_size: int) -> None:
    real = pool._maybe_evict_cached_block

    def counted(block):
        evicted = real(block)
        counts["evicted_tokens"] += block_size if evicted else 0
        return evicted

    pool._maybe_evict_cached_block = counted


def count_hits(manager, counts: dict) -> None:
    """Prefix-cache hit tokens, as the scheduler asks for them (once per admission)."""
    real = manager.get_computed_blocks

    def counted(request, *args, **kwargs):
        found = real(request, *args, **kwargs)
        counts["cached_tokens"] += found[1]  # (blocks, hit tokens, ...)
        return found

    manager.get_computed_blocks = counted


def watch_preemptions(sched: Scheduler, unfreed: list[str]) -> None:
    """Append to ``unfreed`` each request the scheduler preempts whose blocks it cannot free
    at once (a consumer connector under async scheduling fences them behind the step in
    flight: they go to ``deferred_frees``), so the preemption makes no room now."""
    if not hasattr(sched, "defer_block_free"):  # a release without fenced frees
        return
    real = sched._preempt_request

    def _preempt_request(request, *args, **kwargs):
        if not frees_now(sched, request):
            unfreed.append(request.request_id)
        return real(request, *args, **kwargs)

    sched._preempt_request = _preempt_request


def frees_now(sched: Scheduler, request) -> bool:
    """vLLM's own test (``_request_blocks_can_be_freed`` from 0.30; inline in
    ``_free_request_blocks`` before): no fence, or the request's last step is processed."""
    probe = getattr(sched, "_request_blocks_can_be_freed", None)
    if probe is not None:
        return probe(request)
    return not sched.defer_block_free or request.last_sched_seq <= sched.processed_step_seq
