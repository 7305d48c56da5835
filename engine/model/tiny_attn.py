"""Paged attention for the tiny model: per-forward index tables and the two backends
(``torch``: the pure-torch twins of kernels/reference.py; ``triton``: the kernels/ wrappers).

Keeps: a layer reads KV only through its ``AttnIndex.table``, which names, for every request
and absolute position the layer may read, the slot holding that position's KV — the full
pool's slot for full layers; for sliding-window layers only the window of the forward's first
query (kernels/window.py: ``[q - W, q]``), translated to SWA slots through ``full_to_swa`` when
the pool is hybrid. Every other entry is 0 (the padding page), so positions whose SWA KV was
freed are never dereferenced; ``padding_reads`` counts in-range entries that still name the
padding page (a freed slot the layer needs: a scheduler/memory bug, the oracle's witness).

Table of request ``b`` (absolute positions; ``start`` = its first computed token)::

    [0, lo)           0 (padding): outside every computed query's window; lo = max(0, start - W)
    [lo, start)       KV read from the pool (prefix)
    [start, seq_len)  the computed tokens: stored before the attention call
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from kernels import (
    decode_attention_fwd,
    extend_attention_fwd,
    extend_attention_ref,
    mla_decode_fwd,
    store_kv_cache,
    store_kv_cache_ref,
    store_mla_kv_cache,
    store_mla_kv_cache_ref,
    window_start,
)


@dataclass(frozen=True, slots=True)
class AttnIndex:
    """Paging operands of one forward for one kind of layer (full, or sliding-window)."""

    table: torch.Tensor  # int32 [bs, max_seq]: slot of (request b, position p), 0 = unreadable
    rows: torch.Tensor  # int64 [bs]: row b of ``table`` is request b
    prefix_lens: torch.Tensor  # int64 [bs]: positions read from the pool (before ``start``)
    seq_lens: torch.Tensor  # int64 [bs]
    qo_indptr: torch.Tensor  # int64 [bs + 1]: request b computes tokens [qo[b], qo[b+1])
    max_extend: int
    window: int | None  # kernels/window.py convention; None = full attention
    decode: bool  # one computed token per request (its KV stored): the decode kernels apply
    padding_reads: int  # entries in [lo, seq_len) that name the padding page


def build_index(
    req_to_token: np.ndarray,
    rows: np.ndarray,
    starts: np.ndarray,
    seq_lens: np.ndarray,
    window: int | None,
    full_to_swa: np.ndarray | None,
    page_size: int,
    device: str,
) -> AttnIndex:
    """The table of one forward (see the module docstring); ``starts [bs]`` is the position
    of each request's first computed token, ``full_to_swa`` translates for a SWA pool."""
    bs = len(rows)
    table = np.zeros((bs, max(int(seq_lens.max()) if bs else 1, 1)), dtype=np.int64)
    padding = 0
    for b, (row, start, seq) in enumerate(zip(rows.tolist(), starts.tolist(), seq_lens.tolist())):
        lo = window_start(start, window)
        slots = req_to_token[row, lo:seq].astype(np.int64)
        if full_to_swa is not None:
            slots = full_to_swa[slots]
        table[b, lo:seq] = slots
        padding += int(np.count_nonzero(slots < page_size))
    ext = seq_lens - starts
    qo = np.concatenate([[0], np.cumsum(ext)])
    as_t = lambda a, dt=torch.int64: torch.as_tensor(a, dtype=dt, device=device)  # noqa: E731
    decode = bool(bs) and bool((ext == 1).all())
    return AttnIndex(
        as_t(table, torch.int32),
        as_t(np.arange(bs)),
        as_t(starts),
        as_t(seq_lens),
        as_t(qo),
        int(ext.max()) if bs else 0,
        window,
        decode,
        padding,
    )


class AttentionBackend(Protocol):
    """Stores new KV into a pool buffer and attends over a request's table."""

    name: str

    def store(
        self,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None: ...

    def store_latent(
        self, kv_buf: torch.Tensor, loc: torch.Tensor, latent: torch.Tensor, rank: int
    ) -> None: ...

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        idx: AttnIndex,
        sm_scale: float,
    ) -> torch.Tensor: ...

    def attend_latent(
        self,
        q: torch.Tensor,
        latent: torch.Tensor,
        kv_buf: torch.Tensor,
        idx: AttnIndex,
        sm_scale: float,
        rank: int,
    ) -> torch.Tensor: ...


class TorchAttention:
    """CPU default: the pure-torch twins (float64 stays float64)."""

    name = "torch"

    def store(
        self,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """``k [n, Hkv, D]``, ``v [n, Hkv, Dv]`` into rows ``loc [n]``."""
        store_kv_cache_ref(k, v, k_buf, v_buf, loc)

    def store_latent(
        self, kv_buf: torch.Tensor, loc: torch.Tensor, latent: torch.Tensor, rank: int
    ) -> None:
        """``latent [n, 1, R + P]`` into rows ``loc [n]``."""
        store_mla_kv_cache_ref(latent[..., :rank], latent[..., rank:], kv_buf, loc)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        idx: AttnIndex,
        sm_scale: float,
    ) -> torch.Tensor:
        """``q [M, Hq, D]``, the computed tokens' ``k/v [M, Hkv, *]`` -> ``o [M, Hq, Dv]``."""
        return extend_attention_ref(
            q,
            k,
            v,
            k_buf,
            v_buf,
            idx.table,
            idx.rows,
            idx.prefix_lens,
            idx.qo_indptr,
            sm_scale,
            idx.window,
        )

    def attend_latent(
        self,
        q: torch.Tensor,
        latent: torch.Tensor,
        kv_buf: torch.Tensor,
        idx: AttnIndex,
        sm_scale: float,
        rank: int,
    ) -> torch.Tensor:
        """MQA over the latent: ``q [M, Hq, R + P]``, ``latent [M, 1, R + P]`` -> ``[M, Hq, R]``
        (V aliases the latent's first ``rank`` columns)."""
        return self.attend(q, latent, latent[..., :rank], kv_buf, kv_buf[..., :rank], idx, sm_scale)


class TritonAttention(TorchAttention):
    """The kernels/ wrappers: decode kernels for pure decode batches, else the extend kernel
    (MLA extend runs it as MQA over the latent buffer, V = its first ``rank`` columns)."""

    name = "triton"

    def store(
        self,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        store_kv_cache(k, v, k_buf, v_buf, loc)

    def store_latent(
        self, kv_buf: torch.Tensor, loc: torch.Tensor, latent: torch.Tensor, rank: int
    ) -> None:
        store_mla_kv_cache(latent[..., :rank], latent[..., rank:], kv_buf, loc)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        idx: AttnIndex,
        sm_scale: float,
    ) -> torch.Tensor:
        if idx.decode:
            return decode_attention_fwd(
                q, k_buf, v_buf, idx.table, idx.rows, idx.seq_lens, sm_scale, idx.window
            )
        return extend_attention_fwd(
            q,
            k,
            v,
            k_buf,
            v_buf,
            idx.table,
            idx.rows,
            idx.prefix_lens,
            idx.qo_indptr,
            sm_scale,
            idx.window,
            max_len_extend=idx.max_extend,
        )

    def attend_latent(
        self,
        q: torch.Tensor,
        latent: torch.Tensor,
        kv_buf: torch.Tensor,
        idx: AttnIndex,
        sm_scale: float,
        rank: int,
    ) -> torch.Tensor:
        if idx.decode:
            return mla_decode_fwd(
                q, kv_buf, idx.table, idx.rows, idx.seq_lens, sm_scale, rank, idx.window
            )
        return self.attend(q, latent, latent[..., :rank], kv_buf, kv_buf[..., :rank], idx, sm_scale)


def make_backend(name: str) -> AttentionBackend:
    return TritonAttention() if name == "triton" else TorchAttention()
