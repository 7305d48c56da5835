"""Hybrid SWA and MLA configurations of the real-scheduler target: the model a config op
names, written as the ``config.json`` the release reads, the server arguments it adds, and
what the release built (for the config answer). The pools themselves are built by the
release's own pool code (hybrid_pools.py).

A config op may carry

    "swa": {"window": W, "tokens": T}   hybrid SWA: layer 0 slides over W tokens, layer 1 is
                                        full attention; the SWA pool holds T tokens
    "mla": true                         MLA (DeepSeek-V3 geometry, 2 layers)

Keeps: the model is never loaded (the worker is fake); only its config.json is read, by
SGLang's own ``ModelConfig``, which decides ``is_hybrid_swa``, the SWA layer ids, the window
and ``attention_arch`` exactly as for a real checkpoint. Runs inside the sglang venv; imports
nothing of kvspec.

Shims (why):
1. The model is ``GptOssForCausalLM`` with ``layer_types`` [sliding, full]: the one
   architecture every release 0.5.10 ... 0.5.23 lists in ``is_hybrid_swa_model``; its
   ``sliding_window`` is W + 1 because ``GptOssForCausalLM.get_attention_sliding_window_size``
   is ``sliding_window - 1`` (so SGLang's window is exactly the trace's W).
2. ``attention_backend=triton`` for hybrid SWA: GPT-OSS's ServerArgs check asks for a backend
   with sliding windows and sinks; no backend is ever built here (the forward is fake).
3. ``release_model``: a stand-in for the loaded model carrying only what the pool code asks of
   it (the architecture class's own ``get_attention_sliding_window_size``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from types import SimpleNamespace

import pools

COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 256,
    "eos_token_id": 257,
}
SWA_MODEL = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "layer_types": ["sliding_attention", "full_attention"],
    "num_local_experts": 2,
    "num_experts_per_tok": 1,
}
# DeepseekV3ForCausalLM: ModelConfig sets attention_arch = MLA; the pool stores
# kv_lora_rank + qk_rope_head_dim per token; no MoE layer (first_k_dense_replace = layers)
MLA_MODEL = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 2,
    "n_routed_experts": 2,
    "num_experts_per_tok": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": None,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "v_head_dim": 8,
}


def kind(cfg: dict) -> str:
    """``plain``, ``swa`` or ``mla`` (no release builds a hybrid MLA+SWA pool for DeepSeek-V3,
    so both at once is refused)."""
    if cfg.get("swa") and cfg.get("mla"):
        raise ValueError("swa + mla: no release builds a hybrid MLA+SWA pool for DeepSeek-V3")
    if cfg.get("swa"):
        return "swa"
    return "mla" if cfg.get("mla") else "plain"


def model_path(cfg: dict) -> str:
    """The model folder SGLang reads: the plain llama one, or a config.json written once per
    distinct config (named by its digest, so traces share it and nothing piles up)."""
    which = kind(cfg)
    if which == "plain":
        return pools.MODEL
    config = dict(COMMON, **(SWA_MODEL if which == "swa" else MLA_MODEL))
    if which == "swa":
        config["sliding_window"] = int(cfg["swa"]["window"]) + 1  # shim 1
    text = json.dumps(config, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), f"kvspec-model-{which}-{digest}")
    if not os.path.exists(os.path.join(folder, "config.json")):
        os.makedirs(folder, exist_ok=True)
        staged = os.path.join(folder, f"config.json.{os.getpid()}")
        with open(staged, "w") as out:
            out.write(text)
        os.replace(staged, os.path.join(folder, "config.json"))  # atomic: children race
    return folder


def server_args(cfg: dict) -> dict:
    """What a hybrid configuration adds to the server arguments: shim 2, and the SWA pool's
    size as the release's own ``swa_full_tokens_ratio`` of ``--max-total-tokens``."""
    if kind(cfg) != "swa":
        return {}
    extra: dict = {"attention_backend": "triton"}
    tokens = cfg["swa"].get("tokens")
    if tokens is not None:
        # the configurators take int(full * ratio) // page * page: a hair over, so that the
        # float product does not floor one token short
        extra["swa_full_tokens_ratio"] = min(1.0, (int(tokens) + 0.5) / cfg["pool_tokens"])
    return extra


def release_model(model_config):
    """Shim 3: the stand-in model (``ModelRegistry`` resolves the architecture's class, as
    ``get_model_architecture`` does)."""
    from sglang.srt.models.registry import ModelRegistry

    cls, _ = ModelRegistry.resolve_model_cls(model_config.hf_config.architectures)
    model = SimpleNamespace(config=model_config.hf_config)
    if hasattr(cls, "get_attention_sliding_window_size"):
        model.get_attention_sliding_window_size = lambda: cls.get_attention_sliding_window_size(
            model
        )
    return model


def describe(scheduler) -> dict:
    """What the release built (the config answer's ``built``): pool, allocator and tree
    classes and sizes, the window."""
    runner = scheduler.tp_worker.model_runner
    kv, alloc = runner.token_to_kv_pool, scheduler.token_to_kv_pool_allocator
    tree, rows = scheduler.tree_cache, scheduler.req_to_token_pool
    inner = getattr(tree, "inner", None)
    found = dict(
        kv_pool=type(kv).__name__,
        allocator=type(alloc).__name__,
        tree_cache=type(tree).__name__ + (f"({type(inner).__name__})" if inner else ""),
        req_to_token_pool=[rows.size, rows.max_context_len],
        is_hybrid_swa=bool(getattr(scheduler, "is_hybrid_swa", False)),
        sliding_window_size=getattr(scheduler, "sliding_window_size", None),
        max_total_num_tokens=scheduler.max_total_num_tokens,
    )
    if hasattr(kv, "full_kv_pool"):
        found.update(
            full_pool=[type(kv.full_kv_pool).__name__, kv.full_kv_pool.size],
            swa_pool=[type(kv.swa_kv_pool).__name__, kv.swa_kv_pool.size],
        )
    if hasattr(kv, "kv_lora_rank"):
        found.update(kv_lora_rank=kv.kv_lora_rank, qk_rope_head_dim=kv.qk_rope_head_dim)
    components = getattr(tree, "tree_components", None) or getattr(tree, "components", None)
    if components:
        found["tree_components"] = sorted(str(c) for c in components)
    return found
