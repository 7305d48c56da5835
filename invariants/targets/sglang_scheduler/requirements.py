"""What an SGLang release needs installed on a CPU-only box, derived from its own metadata: the
wheel's declared requirements (``Requires-Dist``), markers evaluated for this machine, extras
left out, every GPU-only package dropped (each with the reason it cannot run here) and the
torch pin replaced by the CPU wheel these machines provide.

Keeps: no hand-pinned list per release: every release gets its own pins. What installs but
cannot import on CPU (a transformers whose image processors need torchvision) is the drivers'
import stubs' business (``targets/sglang/driver/stubs.py``), not the recipe's.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

TORCH = "torch==2.13.0"  # the CPU wheel these machines provide; an unpinned torch pulls CUDA
# GPU-only packages, by name: what each is (why it cannot run, or install, on CPU)
GPU_ONLY = {
    "torchvision": "its PyPI wheels pin a CUDA torch; stubbed (stubs.py)",
    "torchaudio": "pins a CUDA torch",
    "torchcodec": "pins a CUDA torch",
    "torchao": "pins a torch of its own",
    "torch-memory-saver": "CUDA memory hooks",
    "timm": "needs torchvision",
    "sglang-kernel": "CUDA kernels (stubbed as sgl_kernel where imported)",
    "sgl-kernel": "CUDA kernels",
    "flashinfer-python": "CUDA kernels",
    "flashinfer-cubin": "CUDA kernels",
    "flash-attn-4": "CUDA kernels",
    "cuda-python": "CUDA bindings",
    "cuda-tile": "CUDA kernels",
    "nvidia-cutlass-dsl": "CUDA kernels",
    "nvidia-mathdx": "CUDA libraries",
    "nvshmem4py-cu13": "CUDA libraries",
    "quack-kernels": "CUDA kernels",
    "humming-kernels": "CUDA kernels",
    "tilelang": "CUDA kernels",
    "tokenspeed-mla": "CUDA kernels",
    "helion": "GPU kernels (pins a triton)",
    "triton": "GPU kernels' compiler (1 GB); the drivers stand SGLang's own triton mock in",
}
GPU_ONLY_PREFIXES = ("sgl-", "nvidia-cu", "cuda-")  # sgl-deep-gemm, sgl-flash-mla, ...


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_only(name: str) -> str | None:
    """Why ``name`` is not installed here (None: it is)."""
    key = canonical(name)
    if key in GPU_ONLY:
        return GPU_ONLY[key]
    if key.startswith(GPU_ONLY_PREFIXES):
        return "CUDA kernels or libraries"
    return None


def wheel_requires(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode()
    return metadata_requires(text)


def metadata_requires(text: str) -> list[str]:
    """The ``Requires-Dist`` lines of a METADATA text."""
    prefix = "Requires-Dist:"
    return [line[len(prefix) :].strip() for line in text.splitlines() if line.startswith(prefix)]


def cpu_requirements(declared: list[str]) -> list[str]:
    """The requirements to install on this machine, in the order declared, the CPU torch
    first: extras and other platforms' markers left out, GPU-only packages dropped."""
    chosen = [TORCH]
    for line in declared:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if gpu_only(req.name) or canonical(req.name) == "torch":  # the CPU wheel, first
            continue
        chosen.append(pip_argument(req))
    return chosen


def pip_argument(req: Requirement) -> str:
    """``req`` as a pip argument (its marker dropped: it was evaluated)."""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"


def dropped(declared: list[str]) -> dict[str, str]:
    """The GPU-only requirements left out, each with why (for the build's log)."""
    found = {}
    for line in declared:
        req = Requirement(line)
        why = gpu_only(req.name) or (canonical(req.name) == "torch" and f"replaced by {TORCH}")
        if why and (req.marker is None or req.marker.evaluate({"extra": ""})):
            found[req.name] = why
    return found


def is_release(version: str) -> bool:
    """A release version (0.5.23, 0.5.10.post1), not a development one."""
    parsed = Version(version)
    return not (parsed.is_devrelease or parsed.local or parsed.is_prerelease)
