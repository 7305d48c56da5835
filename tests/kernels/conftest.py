"""Fixtures for the kernel tests: the device, tile sizes legal on it, paged-pool builders.

NOTE: Triton chooses interpreter vs compiler at its *first import* in the process (its ``tl``
helpers are decorated then), so ``TRITON_INTERPRET=1`` must be set before anything imports
triton. ``kernels`` sets it itself when imported first on a machine without CUDA, and the
top-level tests/conftest.py sets it for the whole suite; the line below only covers running
this folder with a rootdir that skips that conftest. Small-shape tests run on CUDA (compiled)
when a GPU is present, interpreted on CPU otherwise.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@dataclass(frozen=True)
class PagedRows:
    """A request-to-token table over shuffled pages: row ``rows[b]`` maps request ``b``."""

    req_to_token: torch.Tensor  # (num_rows, max_ctx) int32; row 0 and slot 0 reserved
    rows: torch.Tensor  # (B,) int64
    num_slots: int


def make_paged_rows(lens: list[int], page_size: int, device: str, seed: int = 0) -> PagedRows:
    """Give request ``b`` ``ceil(lens[b] / page_size)`` shuffled pages and a shuffled row."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_req = [math.ceil(n / page_size) for n in lens]
    num_pages = sum(pages_per_req) + 3  # page 0 reserved, two spare pages never used
    pages = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    max_ctx = max([page_size, *[p * page_size for p in pages_per_req]])
    req_to_token = torch.zeros(len(lens) + 2, max_ctx, dtype=torch.int32)
    rows = (torch.randperm(len(lens) + 1, generator=gen)[: len(lens)] + 1).tolist()
    for row, n_pages in zip(rows, pages_per_req):
        own, pages = pages[:n_pages], pages[n_pages:]
        slots = [p * page_size + i for p in own for i in range(page_size)]
        req_to_token[row, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
    return PagedRows(
        req_to_token.to(device), torch.tensor(rows, device=device), num_pages * page_size
    )


@pytest.fixture
def device() -> str:
    """The device the small-shape kernel tests run on."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def tile(device: str) -> Callable[[int], int]:
    """Map a wanted tile size to a legal one (compiled ``tl.dot`` needs >= 16)."""
    return lambda n: n if device == "cpu" else max(n, 16)


@pytest.fixture
def paged(device: str) -> Callable[..., PagedRows]:
    """Build ``PagedRows`` for ragged lengths on the test device."""
    return lambda lens, page_size, seed=0: make_paged_rows(lens, page_size, device, seed)


@pytest.fixture
def randn(device: str) -> Callable[..., torch.Tensor]:
    """Seeded normal tensors on the test device (float32 unless told)."""
    gen = torch.Generator().manual_seed(1234)

    def make(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    return make
