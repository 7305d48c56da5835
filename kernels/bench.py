"""Kernel benchmarks: each Triton kernel vs its torch twin vs SDPA at the same shapes (CUDA).

Invariant: every implementation timed for a case computes the same outputs from the same
inputs (``bench_cases`` builds them on any device, so tests check that agreement on CPU);
throughput uses one work count per case: K+V bytes read for decode (GB/s), the bytes moved
for store-KV (GB/s), attended-score FLOPs for extend (TFLOP/s).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.testing

from kernels import reference
from kernels.decode_attention import decode_attention_fwd
from kernels.extend_attention import extend_attention_fwd
from kernels.mla_decode import mla_decode_fwd
from kernels.store_kv import store_kv_cache

Timer = Callable[[Callable[[], object]], float]
"""Returns the time of one call in milliseconds."""


class BenchShape(NamedTuple):
    """One benchmark geometry; decode uses ``prefix_len + extend_len`` as its context."""

    batch: int = 32
    prefix_len: int = 1024
    extend_len: int = 1024
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    kv_lora_rank: int = 512
    rope_dim: int = 64


DEFAULT_SHAPE = BenchShape()


class Case(NamedTuple):
    """One kernel's runners (name -> call) and the work one call does, in ``unit``."""

    runners: dict[str, Callable[[], torch.Tensor | None]]
    work: float
    unit: str


def _paged_rows(shape: BenchShape, ctx: int, device: str) -> tuple[torch.Tensor, int]:
    """Return ``req_to_token`` (rows 1..batch over shuffled pages; row and slot 0 reserved)."""
    pages_per_req = math.ceil(ctx / shape.page_size)
    num_pages = shape.batch * pages_per_req + 1
    pages = torch.randperm(num_pages - 1, generator=torch.Generator().manual_seed(0)) + 1
    offsets = torch.arange(shape.page_size)
    slots = (pages.view(shape.batch, pages_per_req, 1) * shape.page_size + offsets).flatten(1)
    req_to_token = torch.zeros(shape.batch + 1, slots.shape[1], dtype=torch.int32)
    req_to_token[1:] = slots.int()
    return req_to_token.to(device), num_pages * shape.page_size


def _dense(buffer: torch.Tensor, req_to_token: torch.Tensor, ctx: int) -> torch.Tensor:
    """Gather each request's KV densely for SDPA: ``(B, H_kv, ctx, d)`` (not timed)."""
    return buffer[req_to_token[1:, :ctx].long()].transpose(1, 2).contiguous()


def _sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA decode: ``q (B, H_q, D)`` over dense ``k/v (B, H_kv, ctx, *)`` -> ``(B, H_q, Dv)``."""
    return F.scaled_dot_product_attention(q[:, :, None], k, v, scale=scale, enable_gqa=True)[
        :, :, 0
    ]


def _sdpa_extend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """SDPA extend: ``q (B, H_q, ext, D)`` with ``mask (ext, ctx)`` -> ``(B * ext, H_q, Dv)``."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).flatten(0, 1)


def _decode_case(shape: BenchShape, device: str, dtype: torch.dtype, mla: bool) -> Case:
    """Decode (GQA, or MLA when ``mla``) over ``prefix_len + extend_len`` keys per request."""
    ctx = shape.prefix_len + shape.extend_len
    req_to_token, num_slots = _paged_rows(shape, ctx, device)
    rows = torch.arange(1, shape.batch + 1, device=device)
    seq_lens = torch.full((shape.batch,), ctx, device=device)
    index = (req_to_token, rows, seq_lens)
    width = shape.kv_lora_rank + shape.rope_dim if mla else shape.head_dim
    num_kv_heads = 1 if mla else shape.num_kv_heads
    q = torch.randn(shape.batch, shape.num_q_heads, width, device=device, dtype=dtype)
    k_buf = torch.randn(num_slots, num_kv_heads, width, device=device, dtype=dtype)
    v_buf = k_buf[..., : shape.kv_lora_rank] if mla else torch.randn_like(k_buf)
    k, v = _dense(k_buf, req_to_token, ctx), _dense(v_buf, req_to_token, ctx)
    scale = 1.0 / math.sqrt(width)
    if mla:
        args = (q, k_buf, *index, scale, shape.kv_lora_rank)
        fns = (mla_decode_fwd, reference.mla_decode_ref)
    else:
        args = (q, k_buf, v_buf, *index, scale)
        fns = (decode_attention_fwd, reference.decode_attention_ref)
    runners = {
        "triton": partial(fns[0], *args),
        "torch_twin": partial(fns[1], *args),
        "sdpa": partial(_sdpa_decode, q, k, v, scale),
    }
    # NOTE: MLA's V aliases K's latent part, so its K+V bytes are the latent row once.
    row_width = width if mla else width + v_buf.shape[2]
    work = shape.batch * ctx * num_kv_heads * row_width * q.element_size()
    return Case(runners, work, "GB/s")


def _extend_case(shape: BenchShape, device: str, dtype: torch.dtype) -> Case:
    """Extend of ``extend_len`` new tokens per request after a cached ``prefix_len`` prefix."""
    batch, prefix, ext, d = shape.batch, shape.prefix_len, shape.extend_len, shape.head_dim
    req_to_token, num_slots = _paged_rows(shape, prefix + ext, device)
    new = [
        torch.randn(batch * ext, h, d, device=device, dtype=dtype)
        for h in (shape.num_q_heads, shape.num_kv_heads, shape.num_kv_heads)
    ]
    pool = [torch.randn(num_slots, shape.num_kv_heads, d, device=device, dtype=dtype) for _ in "kv"]
    rows = torch.arange(1, batch + 1, device=device)
    index = (
        rows,
        torch.full((batch,), prefix, device=device),
        torch.arange(0, batch * ext + 1, ext, device=device),
    )
    args = (*new, *pool, req_to_token, *index, 1.0 / math.sqrt(d))
    ctx_ids = req_to_token[1:, :prefix].long()
    k, v = (
        torch.cat([p[ctx_ids], n.view(batch, ext, *n.shape[1:])], 1).transpose(1, 2)
        for p, n in zip(pool, new[1:])
    )
    q = new[0].view(batch, ext, shape.num_q_heads, d).transpose(1, 2)
    mask = torch.ones(ext, prefix + ext, dtype=torch.bool, device=device).tril(prefix)
    runners = {
        "triton": partial(extend_attention_fwd, *args, max_len_extend=ext),
        "torch_twin": partial(reference.extend_attention_ref, *args),
        "sdpa": partial(_sdpa_extend, q, k, v, mask),
    }
    attended = batch * (ext * prefix + ext * (ext + 1) // 2)  # (query, key) pairs
    return Case(runners, 2.0 * attended * shape.num_q_heads * (d + d), "TFLOP/s")  # QK^T + PV


def _store_case(shape: BenchShape, device: str, dtype: torch.dtype) -> Case:
    """Store-KV of ``batch * extend_len`` new tokens into shuffled slots."""
    num_tokens = shape.batch * shape.extend_len
    req_to_token, num_slots = _paged_rows(shape, shape.extend_len, device)
    loc = req_to_token[1:, : shape.extend_len].flatten().contiguous()
    kv = [
        torch.randn(num_tokens, shape.num_kv_heads, shape.head_dim, device=device, dtype=dtype)
        for _ in "kv"
    ]
    bufs = [torch.zeros(num_slots, *kv[0].shape[1:], device=device, dtype=dtype) for _ in "kv"]
    runners = {
        "triton": partial(store_kv_cache, *kv, *bufs, loc),
        "torch_twin": partial(reference.store_kv_cache_ref, *kv, *bufs, loc),
    }
    return Case(runners, 2.0 * 2 * kv[0].numel() * kv[0].element_size(), "GB/s")


def bench_cases(shape: BenchShape, device: str, dtype: torch.dtype) -> dict[str, Case]:
    """Build every benchmark case on ``device`` (any device; only timing needs CUDA)."""
    return {
        "decode": _decode_case(shape, device, dtype, mla=False),
        "mla_decode": _decode_case(shape, device, dtype, mla=True),
        "extend": _extend_case(shape, device, dtype),
        "store_kv": _store_case(shape, device, dtype),
    }


def measure_case(case: Case, timer: Timer, peak: float | None) -> dict[str, object]:
    """Time each runner; report ms, throughput in ``case.unit`` and its ratio to ``peak``."""
    scale = 1e9 if case.unit == "GB/s" else 1e12
    report: dict[str, object] = {"unit": case.unit, "work": case.work}
    for name, fn in case.runners.items():
        ms = timer(fn)
        rate = case.work / (ms * 1e-3) / scale
        report[name] = {"ms": ms, "rate": rate, "ratio_to_peak": rate / peak if peak else None}
    return report


def bench_kernels(
    device: str,
    shape: BenchShape = DEFAULT_SHAPE,
    *,
    dtype: torch.dtype = torch.bfloat16,
    peak_gbps: float | None = None,
    peak_tflops: float | None = None,
    timer: Timer | None = None,
) -> dict[str, object]:
    """Time every kernel vs its twin vs SDPA on a CUDA ``device``; return a plain-data report.

    ``peak_gbps`` / ``peak_tflops`` (the device's datasheet peaks) give ``ratio_to_peak`` for
    the bandwidth-bound (decode, store) and compute-bound (extend) cases. Raises
    ``RuntimeError`` on any device but an available CUDA one.
    """
    if not (str(device).startswith("cuda") and torch.cuda.is_available()):
        raise RuntimeError(
            f"bench_kernels needs a CUDA device, got {device!r} "
            f"(torch.cuda.is_available()={torch.cuda.is_available()})"
        )
    timer = timer or (lambda fn: float(triton.testing.do_bench(fn, warmup=25, rep=100)))
    report: dict[str, object] = {
        "device": torch.cuda.get_device_name(torch.device(device)),
        "dtype": str(dtype),
        "shape": shape._asdict(),
    }
    for name, case in bench_cases(shape, device, dtype).items():
        report[name] = measure_case(case, timer, peak_gbps if case.unit == "GB/s" else peak_tflops)
    return report
