"""Compile every Triton kernel for an NVIDIA target on a machine without a GPU (a script).

Run as ``python compile_check.py REPO_ROOT [ARCH]`` in a process where TRITON_INTERPRET is
unset: the kernels then build as compiled JIT functions, and ``triton.compile`` runs the whole
pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin with the wheel's ptxas) without a driver.
Prints one line per kernel with its shared memory, then ``ok``.
"""

from __future__ import annotations

import sys

import triton  # first, so kernels/_runtime.py leaves the compiler selected
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as triton_compile


def build(
    fn: object,
    types: dict[str, str],
    constexprs: dict[str, object],
    arch: int,
    num_warps: int = 4,
    num_stages: int = 2,
) -> None:
    """Compile ``fn`` with pointer/scalar ``types`` (default i32) and ``constexprs``."""
    names = fn.arg_names
    sig = {p: "constexpr" if p in constexprs else types.get(p, "i32") for p in names}
    src = ASTSource(
        fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}
    )
    options = {"num_warps": num_warps, "num_stages": num_stages}
    kernel = triton_compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    print(f"{fn.__name__} smem={kernel.metadata.shared}")


def main(arch: int) -> None:
    """Build decode (GQA, MLA, fp32), the split merge, extend (bf16, fp32) and store."""
    from kernels import decode_attention, extend_attention, store_kv

    idx = {
        "ReqToToken": "*i32",
        "ReqPoolIdx": "*i64",
        "SeqLens": "*i64",
        "sm_scale": "fp32",
        "PrefixLens": "*i64",
        "QoIndptr": "*i64",
        "PartO": "*fp32",
        "PartLse": "*fp32",
    }
    for dt, d, dpe, group, prec in (
        ("bf16", 128, 0, 4, None),
        ("bf16", 512, 64, 128, None),
        ("fp32", 64, 0, 2, "ieee"),
    ):
        types = {**idx, **{p: "*" + dt for p in ("Q", "K", "V")}}
        tile_d = max(16, triton.next_power_of_2(d))
        build(
            decode_attention._decode_stage1,
            types,
            {
                "GROUP": group,
                "NUM_SPLITS": 8,
                "HEAD_TILES": triton.cdiv(group, 16),
                "D": d,
                "DPE": dpe,
                "DV": d,
                "TILE_H": 16,
                "TILE_N": 32,
                "TILE_D": tile_d,
                "TILE_DPE": dpe,
                "TILE_DV": tile_d,
                "PREC": prec,
            },
            arch,
        )
    build(
        decode_attention._decode_stage2,
        {**idx, "Out": "*bf16"},
        {"DV": 128, "NUM_SPLITS": 8, "TILE_S": 8, "TILE_DV": 128},
        arch,
    )
    for dt, d, prec in (("bf16", 128, None), ("fp32", 32, "ieee")):
        types = {**idx, **{p: "*" + dt for p in ("Q", "KExt", "VExt", "Out", "KBuf", "VBuf")}}
        build(
            extend_attention._extend_fwd,
            types,
            {
                "GROUP": 4,
                "D": d,
                "DV": d,
                "TILE_M": 64,
                "TILE_N": 64,
                "TILE_D": d,
                "TILE_DV": d,
                "PREC": prec,
            },
            arch,
            num_warps=4 if d <= 64 else 8,
            num_stages=1,
        )
    build(
        store_kv._scatter_rows,
        {"Src": "*bf16", "Dst": "*bf16", "Loc": "*i32"},
        {"DST_OFFSET": 512, "WIDTH": 64, "TILE_N": 16, "TILE_W": 64},
        arch,
    )
    print("ok")


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    main(int(sys.argv[2]) if len(sys.argv) > 2 else 90)
