"""Test-wide settings: Hypothesis profiles (select with --hypothesis-profile=ci|full|dev)
and the Triton interpreter on machines without CUDA."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Triton reads TRITON_INTERPRET at its first import: set it before any test module
# imports triton, and only where no GPU can run the kernels natively.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

_common = dict(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile(
    "ci", max_examples=100, stateful_step_count=40, derandomize=True, **_common
)
settings.register_profile("full", max_examples=500, stateful_step_count=100, **_common)
settings.register_profile("dev", max_examples=10, stateful_step_count=20, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
