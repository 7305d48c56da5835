"""The packages a vLLM release's v1 scheduler, KV cache manager and config import on CPU, each
with the version range that release's own wheel metadata declares (``Requires-Dist``; markers
evaluated here). Used by ci/vllm_env.sh for a release without a pinned recipe.

  python ci/vllm_requirements.py WHEEL   ->  line 1: the packages installed with their deps
                                             line 2: those installed --no-deps (they would
                                             pull triton or CUDA builds)
GPU-only requirements (torch and its kin, flashinfer, nvidia-*, ...) are never listed: the
venv gets torch's CPU wheel, and the scheduler path needs nothing else of them.
"""

from __future__ import annotations

import sys
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# what the scheduler path imports (found by importing it on a bare venv; ci/vllm_env.sh)
WITH_DEPS = """packaging pydantic regex numpy cbor2 psutil pyzmq transformers aiohttp requests
openai-harmony openai pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo
prometheus_client fastapi partial-json-parser llguidance einops""".split()
# xgrammar's compiled bindings need a matching apache-tvm-ffi (vLLM pins the latter for its
# GPU kernels, not for xgrammar): the pair known to load, where the release admits it
XGRAMMAR_PAIR = ("0.2.8", "0.1.15.post2")


def declared(wheel: str) -> dict[str, Requirement]:
    """The wheel's unconditional requirements (and those whose marker holds here), by name."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(name).decode().splitlines()
    out = {}
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out[canonicalize_name(req.name)] = req
    return out


def spec_of(name: str, reqs: dict[str, Requirement]) -> str:
    req = reqs.get(canonicalize_name(name))
    return f"{name}{req.specifier}" if req is not None and req.specifier else name


def no_deps(reqs: dict[str, Requirement]) -> str:
    xgrammar = reqs.get("xgrammar")
    if xgrammar is None or xgrammar.specifier.contains(XGRAMMAR_PAIR[0]):
        return "xgrammar=={} apache-tvm-ffi=={}".format(*XGRAMMAR_PAIR)
    return f"{spec_of('xgrammar', reqs)} apache-tvm-ffi"


def main(wheel: str) -> None:
    reqs = declared(wheel)
    print(" ".join(spec_of(n, reqs) for n in WITH_DEPS))
    print(no_deps(reqs))


if __name__ == "__main__":
    main(sys.argv[1])
