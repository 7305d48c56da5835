"""Launch plumbing shared by the Triton wrappers: interpreter selection, tiles, input checks.

Invariant: no kernel launches on inputs that break its layout contract; each violation raises
``ValueError`` naming the argument before anything touches the device.

NOTE: Triton decides interpreter vs compiler when ``triton`` is *first imported* (its own
``tl`` helpers are decorated then), so ``TRITON_INTERPRET=1`` must be in the environment before
the first ``import triton`` anywhere in the process. ``kernels/__init__.py`` imports this
module before anything else of the package (so before any kernel module imports triton): on a
machine without CUDA, importing ``kernels`` first sets the variable (there is no CPU compiler,
so the interpreter is the only way to run). ``launch_device`` raises a clear error when triton
was imported earlier in compiled mode and a launch meets CPU tensors.
"""

from __future__ import annotations

import os
import sys

import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
GPU_DOT_MIN = 16
"""``tl.dot`` needs every tile dimension >= 16 when compiled; the interpreter takes any size."""


def triton_interpreted() -> bool:
    """Return whether Triton's language was set up for the interpreter in this process."""
    from triton.runtime.interpreter import InterpretedFunction

    probe = getattr(triton.language.standard, "zeros", None)
    if probe is None:
        return bool(triton.knobs.runtime.interpret)
    return isinstance(probe, InterpretedFunction)


def launch_device(t: torch.Tensor) -> bool:
    """Check that Triton can run on ``t``'s device; return whether it runs interpreted."""
    interpreted = triton_interpreted()
    if t.device.type == "cuda" or (t.device.type == "cpu" and interpreted):
        return interpreted
    if t.device.type == "cpu":
        raise RuntimeError(
            "Triton kernels on CPU tensors need the interpreter: set TRITON_INTERPRET=1 before "
            "the first `import triton` in the process (importing `kernels` first does it on "
            "machines without CUDA)."
        )
    raise RuntimeError(f"unsupported device for Triton kernels: {t.device}")


def pow2(n: int, floor: int) -> int:
    """Return the smallest power of two >= ``max(n, floor)`` (a tile size)."""
    return max(floor, triton.next_power_of_2(max(n, 1)))


def dot_floor(interpreted: bool) -> int:
    """Return the smallest legal ``tl.dot`` tile dimension for the launch mode."""
    return 1 if interpreted else GPU_DOT_MIN


def dot_precision(dtype: torch.dtype) -> str | None:
    """Return ``tl.dot``'s input precision: exact for fp32 inputs (no TF32), else the default."""
    return "ieee" if dtype == torch.float32 else None


def require(cond: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``cond`` holds."""
    if not cond:
        raise ValueError(message)


def check_float(name: str, t: torch.Tensor, ndim: int) -> None:
    """Check a float operand: rank, dtype and a contiguous last dim."""
    require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t)}")
    require(t.dim() == ndim, f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    require(t.dtype in FLOAT_DTYPES, f"{name} dtype must be one of {FLOAT_DTYPES}, got {t.dtype}")
    require(t.stride(-1) == 1, f"{name} last dim must be contiguous, got strides {t.stride()}")


def check_index(
    name: str, t: torch.Tensor, ndim: int, dtypes: tuple[torch.dtype, ...] = INDEX_DTYPES
) -> None:
    """Check an index operand: rank, integer dtype and a contiguous last dim."""
    require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t)}")
    require(t.dim() == ndim, f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    require(t.dtype in dtypes, f"{name} dtype must be one of {dtypes}, got {t.dtype}")
    require(t.stride(-1) == 1, f"{name} last dim must be contiguous, got strides {t.stride()}")


def check_shape(name: str, t: torch.Tensor, expected: tuple[int | None, ...]) -> None:
    """Check ``t.shape`` against ``expected`` (``None`` matches any size)."""
    ok = t.dim() == len(expected) and all(e is None or e == s for e, s in zip(expected, t.shape))
    shown = tuple("*" if e is None else e for e in expected)
    require(ok, f"{name} must have shape {shown}, got {tuple(t.shape)}")


def check_same_device(device: torch.device, **tensors: torch.Tensor) -> None:
    """Check that every tensor lives on ``device``."""
    for name, t in tensors.items():
        require(t.device == device, f"{name} is on {t.device}, expected {device}")


def check_same_dtype(dtype: torch.dtype, **tensors: torch.Tensor) -> None:
    """Check that every tensor has ``dtype``."""
    for name, t in tensors.items():
        require(t.dtype == dtype, f"{name} dtype is {t.dtype}, expected {dtype}")
