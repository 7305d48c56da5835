"""Triton attention kernels for the paged KV pool, each with a pure-torch twin (reference.py).

Invariant: every kernel and its twin compute the same function of the same arguments, under
the one sliding-window convention of kernels/window.py: a query at absolute position ``q``
with window ``W`` attends keys ``[max(0, q - W), q]``; ``None`` (or ``W < 0``) = no window.

This package imports nothing else of the project (only torch, triton and the stdlib).
CPU tensors run through the Triton interpreter, which must be chosen before the first
``import triton`` in the process (kernels/_runtime.py explains; importing ``kernels`` first
on a machine without CUDA sets ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

from kernels import _runtime  # noqa: F401  (first: picks the interpreter before triton loads)
from kernels.decode_attention import decode_attention_fwd
from kernels.extend_attention import extend_attention_fwd
from kernels.mla_decode import mla_decode_fwd
from kernels.reference import (
    decode_attention_ref,
    extend_attention_ref,
    mla_decode_ref,
    naive_dense_attention,
    store_kv_cache_ref,
    store_mla_kv_cache_ref,
)
from kernels.store_kv import store_kv_cache, store_mla_kv_cache
from kernels.window import normalize_window, visible_mask, window_start

__all__ = [
    "decode_attention_fwd",
    "decode_attention_ref",
    "extend_attention_fwd",
    "extend_attention_ref",
    "mla_decode_fwd",
    "mla_decode_ref",
    "naive_dense_attention",
    "normalize_window",
    "store_kv_cache",
    "store_kv_cache_ref",
    "store_mla_kv_cache",
    "store_mla_kv_cache_ref",
    "visible_mask",
    "window_start",
]
