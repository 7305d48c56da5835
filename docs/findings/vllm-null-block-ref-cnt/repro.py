#!/usr/bin/env python3
"""Reproducer: vLLM's null block ``ref_cnt`` runs negative with a sliding-window group, and
the scheduler never reports empty (vLLM's own ``assert_scheduler_empty`` fails).

vLLM alone (no kvspec, no GPU: ``VLLM_TARGET_DEVICE=cpu``): its real v1 ``Scheduler`` built as
its tests build one (tests/v1/core/utils.py ``create_scheduler``) over a full-attention and a
sliding-window KV-cache group (block size 16, window 32) with prefix caching; one request of
57 prompt tokens and 4 output tokens runs to the end, the model runner's output faked (one
sampled token per step). Then what ``assert_scheduler_empty`` asks of the block pool: every
block's ``ref_cnt`` is 0. Exit 1: the null block's is not (observed); exit 0: clean.

    VLLM_TARGET_DEVICE=cpu python repro.py
"""

import json
import os
import sys
import tempfile

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK, WINDOW, PROMPT, OUTPUT = 16, 32, 57, 4
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
    "num_hidden_layers": 1, "vocab_size": 1024, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}


def scheduler() -> Scheduler:
    model_dir = tempfile.mkdtemp()
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(LLAMA, f)
    model = ModelConfig(model=model_dir, dtype="float32", skip_tokenizer_init=True,
                        max_model_len=512)
    config = VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32,
                                         max_model_len=512, enable_chunked_prefill=True,
                                         is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
    )
    shape = dict(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    groups = [KVCacheGroupSpec(["full"], FullAttentionSpec(**shape)),
              KVCacheGroupSpec(["swa"], SlidingWindowSpec(**shape, sliding_window=WINDOW))]
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)
    config.cache_config.num_gpu_blocks = 64
    return Scheduler(vllm_config=config, kv_cache_config=kv, block_size=BLOCK,
                     structured_output_manager=StructuredOutputManager(config), log_stats=True)


def main() -> int:
    init_none_hash(sha256)
    sched = scheduler()
    params = SamplingParams(ignore_eos=True, max_tokens=OUTPUT)
    request = Request(request_id="r0", prompt_token_ids=list(range(10, 10 + PROMPT)),
                      sampling_params=params, pooling_params=None,
                      block_hasher=get_request_block_hasher(BLOCK, sha256))
    sched.add_request(request)
    steps = 0
    while sched.has_requests() and steps < 100:
        out = sched.schedule()
        rids = list(out.num_scheduled_tokens)
        sampled = [[] if sched.requests[r].is_prefill_chunk else [7] for r in rids]
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)},
            sampled_token_ids=sampled))
        steps += 1
    pool = sched.kv_cache_manager.block_pool
    held = [(b.block_id, b.ref_cnt) for b in pool.blocks if b.ref_cnt != 0]
    print(f"vllm {__import__('vllm').__version__}: request finished after {steps} steps; "
          f"null block {pool.null_block.block_id} ref_cnt={pool.null_block.ref_cnt}")
    if held:
        print(f"OBSERVED: blocks with ref_cnt != 0 at idle (block, ref_cnt): {held}")
        return 1
    print("clean: every block's ref_cnt is 0 at idle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
