"""Every wrapper rejects malformed operands with a ValueError naming the argument."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels import decode_attention_fwd, extend_attention_fwd, mla_decode_fwd, store_kv_cache


@pytest.fixture
def decode_args(paged: Callable, randn: Callable) -> dict[str, object]:
    """Valid decode operands (two requests, GQA group 2) to break one at a time."""
    pool = paged([3, 5], 1)
    return {
        "q": randn(2, 4, 16),
        "k_buffer": randn(pool.num_slots, 2, 16),
        "v_buffer": randn(pool.num_slots, 2, 16),
        "req_to_token": pool.req_to_token,
        "req_pool_indices": pool.rows,
        "seq_lens": torch.tensor([3, 5], device=pool.rows.device),
        "sm_scale": 0.25,
    }


BAD_DECODE = [
    ("seq_lens", lambda a: a["seq_lens"].float(), "seq_lens dtype"),
    ("req_to_token", lambda a: a["req_to_token"].long(), "req_to_token dtype"),
    (
        "req_pool_indices",
        lambda a: a["req_pool_indices"][:1],
        r"req_pool_indices must have shape \(2,\)",
    ),
    (
        "q",
        lambda a: a["q"].transpose(1, 2).contiguous().transpose(1, 2),
        "q last dim must be contiguous",
    ),
    ("q", lambda a: a["q"][:, :3], "must be a multiple of H_kv"),
    ("k_buffer", lambda a: a["k_buffer"][..., :8], "k_buffer must have shape"),
    ("v_buffer", lambda a: a["v_buffer"].half(), "v_buffer dtype"),
    ("q", lambda a: a["q"][0], "q must have 3 dims"),
]


@pytest.mark.parametrize(("name", "breaker", "message"), BAD_DECODE)
def test_decode_rejects_malformed_operands(
    decode_args: dict[str, object], name: str, breaker: Callable, message: str
) -> None:
    """Shapes, dtypes, index dtypes, GQA divisibility and last-dim strides are checked."""
    decode_args[name] = breaker(decode_args)
    with pytest.raises(ValueError, match=message):
        decode_attention_fwd(**decode_args)


def test_mla_decode_rejects_a_rank_wider_than_q(decode_args: dict[str, object]) -> None:
    """kv_lora_rank must fit inside q's last dim (latent + rope)."""
    kv = decode_args["k_buffer"][:, :1]
    args = [decode_args[n] for n in ("q", "req_to_token", "req_pool_indices", "seq_lens")]
    with pytest.raises(ValueError, match="kv_lora_rank"):
        mla_decode_fwd(args[0], kv, *args[1:], 0.1, kv_lora_rank=17)


def test_decode_rejects_an_illegal_tile(decode_args: dict[str, object]) -> None:
    """Tile overrides must be powers of two."""
    with pytest.raises(ValueError, match="tile_n must be a power of two"):
        decode_attention_fwd(**decode_args, tile_n=24)


def test_extend_rejects_a_short_qo_indptr(decode_args: dict[str, object], randn: Callable) -> None:
    """qo_indptr needs B + 1 entries."""
    a = decode_args
    new = (randn(4, 4, 16), randn(4, 2, 16), randn(4, 2, 16))
    lens = a["seq_lens"]
    with pytest.raises(ValueError, match=r"qo_indptr must have shape \(3,\)"):
        extend_attention_fwd(
            *new,
            a["k_buffer"],
            a["v_buffer"],
            a["req_to_token"],
            a["req_pool_indices"],
            lens,
            lens,
            0.25,
        )


def test_store_kv_rejects_a_dtype_mismatch(decode_args: dict[str, object], randn: Callable) -> None:
    """The stored rows must already have the pool's dtype (no silent cast)."""
    a = decode_args
    loc = a["req_to_token"][a["req_pool_indices"][0], :2]
    with pytest.raises(ValueError, match="k dtype"):
        store_kv_cache(randn(2, 2, 16).half(), randn(2, 2, 16), a["k_buffer"], a["v_buffer"], loc)
