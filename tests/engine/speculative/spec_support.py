"""Shared helpers for the EAGLE tests: the scheduler grid's workload and engine with EAGLE
on, a strict run that returns the engine, and seeded prompts.

Keeps: ``eagle_config`` sets the overlap scheduler the version needs (v2 on, v1 off, as
SGLang), everything else as the scheduler tests' ``grid_config``; ``run_strict`` checks the
whole shipped catalog at level 2 at every event.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.config import EngineConfig, MemoryConfig
from engine.config.speculative import SpecConfig
from engine.engine import Engine, GenerateResult
from engine.request import SamplingParams
from tests.engine.sched.sched_support import Workload, grid_config, prompts, strict_hook


def spec(version: int, num_steps: int = 3, accept_prob: float = 0.7) -> SpecConfig:
    return SpecConfig(
        version=version,
        num_steps=num_steps,
        num_draft_tokens=num_steps + 1,
        accept_prob=accept_prob,
    )


def eagle_config(
    w: Workload, version: int, *, num_steps: int = 3, accept_prob: float = 0.7, **grid: Any
) -> EngineConfig:
    """The scheduler grid's engine for ``w`` with EAGLE ``version`` (overlap set to match)."""
    base = grid_config(w, overlap=version == 2, **grid)
    return replace(base, speculative=spec(version, num_steps, accept_prob))


def small_config(
    version: int | None,
    *,
    page_size: int = 4,
    total: int = 2048,
    overlap: bool | None = None,
    retract: bool = False,
    swa: bool = False,
    seed: int = 5,
    accept_prob: float = 0.8,
    num_steps: int = 3,
    eos_prob: float = 0.0,
    strict: bool = True,
    **extra: Any,
) -> EngineConfig:
    """A small radix-cache engine (chunked prefill 64, retract every third forward when
    ``retract``); ``version`` None: no speculation (overlap as given, default off)."""
    mem = MemoryConfig(
        page_size=page_size,
        max_total_tokens=total,
        max_num_reqs=8,
        context_len=512,
        strict=strict,
        swa_tokens=total // 2 if swa else None,
        sliding_window=max(16, 2 * page_size) if swa else None,
    )
    ov = (version == 2) if overlap is None and version is not None else bool(overlap)
    return EngineConfig(
        memory=mem,
        seed=seed,
        enable_overlap=ov,
        chunked_prefill_size=max(64, page_size),
        test_retract=retract,
        eos_prob=eos_prob,
        **extra,
        speculative=None if version is None else spec(version, num_steps, accept_prob),
    )


def run_strict(
    config: EngineConfig, ps: list[list[int]], max_new: int, observers: tuple[Any, ...] = ()
) -> tuple[list[GenerateResult], Engine]:
    """Generate under the level-2 checker (raises InvariantViolation at the first finding)."""
    engine = Engine(config, observers=[strict_hook(), *observers])
    return engine.generate(ps, SamplingParams(max_new_tokens=max_new)), engine


def tokens(results: list[GenerateResult]) -> list[tuple[tuple[int, ...], str]]:
    return [(r.output_ids, r.finish_reason.kind) for r in results]


__all__ = ["eagle_config", "prompts", "run_strict", "small_config", "spec", "tokens"]
