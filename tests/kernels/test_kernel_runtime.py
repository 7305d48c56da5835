"""Launch plumbing: interpreter selection by import order, and the CUDA-only benchmark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from kernels.bench import BenchShape, Case, bench_cases, bench_kernels, measure_case

REPO = Path(kernels.__file__).resolve().parent.parent
TINY_DECODE = """
import torch
q = torch.randn(1, 2, 16); buf = torch.randn(8, 1, 16)
rows = torch.zeros(2, 8, dtype=torch.int32); rows[1] = torch.arange(8)
idx = torch.tensor([1]); lens = torch.tensor([5])
out = kernels.decode_attention_fwd(q, buf, buf, rows, idx, lens, 0.25)
ref = kernels.decode_attention_ref(q, buf, buf, rows, idx, lens, 0.25)
torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-3)
print("ok")
"""


def _run_cpu_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that sees no GPU and no TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_importing_kernels_first_selects_the_interpreter_without_cuda() -> None:
    """Without CUDA and without TRITON_INTERPRET, `import kernels` first makes CPU launches work."""
    done = _run_cpu_python("import kernels\n" + TINY_DECODE)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_triton_imported_first_gives_a_clear_error_on_cpu() -> None:
    """If triton was imported before the interpreter was chosen, CPU launches say how to fix it."""
    done = _run_cpu_python("import triton, kernels\n" + TINY_DECODE)
    assert done.returncode != 0
    assert "RuntimeError" in done.stderr and "TRITON_INTERPRET=1" in done.stderr


def test_bench_kernels_refuses_a_cpu_device() -> None:
    """Benchmarks time CUDA kernels only; a CPU device is a clear RuntimeError."""
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        bench_kernels("cpu")


def test_bench_cases_compute_the_same_outputs(device: str) -> None:
    """Every runner of a benchmark case (Triton, twin, SDPA) returns the same output."""
    shape = BenchShape(
        batch=2,
        prefix_len=5,
        extend_len=3,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        page_size=4,
        kv_lora_rank=16,
        rope_dim=16,
    )
    cases = bench_cases(shape, device, torch.float32)
    for name in ("decode", "mla_decode", "extend"):
        outs = [fn() for fn in cases[name].runners.values()]
        assert len(outs) == 3 and cases[name].work > 0
        for other in outs[1:]:
            torch.testing.assert_close(other, outs[0], atol=1e-4, rtol=1e-3, msg=name)
    assert cases["store_kv"].runners["triton"]() is None


def test_measure_case_reports_rate_and_ratio_to_peak() -> None:
    """Throughput is work / time in the case's unit; the ratio divides by the given peak."""
    case = Case({"triton": lambda: None, "sdpa": lambda: None}, work=4e9, unit="GB/s")
    report = measure_case(case, timer=lambda fn: 2.0, peak=4000.0)
    assert report["triton"] == {"ms": 2.0, "rate": 2000.0, "ratio_to_peak": 0.5}
    flops = measure_case(Case({"triton": lambda: None}, 3e12, "TFLOP/s"), lambda fn: 1000.0, None)
    assert flops["triton"] == {"ms": 1000.0, "rate": 3.0, "ratio_to_peak": None}


def test_every_kernel_compiles_for_an_nvidia_target_without_a_gpu() -> None:
    """The compiled (non-interpreted) front end accepts every kernel at real shapes (sm90)."""
    pytest.importorskip("triton.backends.nvidia")
    script = Path(__file__).with_name("compile_check.py")
    done = _run_cpu_python(
        f"import runpy, sys; sys.argv = ['x', {str(REPO)!r}, '90']; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
