"""The machine a benchmark's numbers belong to (written into `kvspec bench sim`'s JSON)."""

from __future__ import annotations

import os
import platform
import sys
from contextlib import suppress
from importlib import import_module
from typing import Any


def machine_info() -> dict[str, Any]:
    """The machine the numbers belong to."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    for package in ("numpy", "numba", "torch"):
        try:
            info[package] = import_module(package).__version__
        except ImportError:
            info[package] = None
    return info


def _cpu_model() -> str:
    with suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"
