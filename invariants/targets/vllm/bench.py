"""`kvspec bench vllm`: iterations/s of vLLM's real scheduler on one spec's trace, unchecked
(the driver builds no view: ``schedule`` + ``update_from_output`` + the op plumbing) and
checked (a state view per step, the whole catalog on it), in one driver process, best of
``runs`` each; the ratio is what checking costs on that workload.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from invariants.bench.machine import machine_info
from invariants.checking.checker import Checker, Level
from invariants.checking.loader import load_catalog
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import load_spec
from invariants.targets.sglang.run import drive_trace
from invariants.targets.vllm.blocks import BlockMirror
from invariants.targets.vllm.run import driver_config, unsupported
from invariants.targets.vllm.target import VLLMDriver


def _one(driver: VLLMDriver, trace: Any, checked: bool) -> tuple[float, int, int]:
    """Seconds, steps and checks of one run of ``trace`` (config op to idle)."""
    checker = Checker(load_catalog(), level=Level.RECORD) if checked else None
    config = {**driver_config(trace.engine), "views": checked}  # unchecked: no view is built
    start = time.perf_counter()
    counts, _, error, _ = drive_trace(driver, trace, config, checker, decode=BlockMirror().view)
    seconds = time.perf_counter() - start
    if error is not None:
        raise RuntimeError(f"vllm bench: {error}")
    checks = sum(s.evaluations for s in checker.stats().values()) if checker else 0
    return seconds, counts["steps"], checks


def bench_vllm(spec_path: Path, runs: int = 3, python: str | None = None) -> dict[str, Any]:
    """Both modes on ``spec_path``, ``runs`` times each, one driver (its import paid once)."""
    trace = build_trace(load_spec(spec_path))
    missing = unsupported(trace)
    if missing:
        raise ValueError(f"{spec_path}: not supported by the vllm target: {'; '.join(missing)}")
    with VLLMDriver(python) as driver:
        best = {
            mode: min((_one(driver, trace, mode == "checked") for _ in range(runs)),
                      key=lambda r: r[0])
            for mode in ("unchecked", "checked")
        }  # fmt: skip
        version = driver.version
    rows = {
        mode: {"seconds": round(s, 3), "steps": n, "checks": c, "steps_per_s": round(n / s, 1)}
        for mode, (s, n, c) in best.items()
    }
    ratio = rows["checked"]["seconds"] / max(rows["unchecked"]["seconds"], 1e-9)
    return {"machine": machine_info(), "vllm": version, "spec": str(spec_path), "runs": runs,
            "modes": rows, "checked_over_unchecked": round(ratio, 2)}  # fmt: skip
