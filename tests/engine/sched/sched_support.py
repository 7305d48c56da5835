"""Shared helpers for the scheduler tests: the YAML checker as a step hook, a plain
accounting check, seeded prompts, the workload of the feature grid, and an all-pairs
generator for configuration matrices.

Keeps: ``strict_hook()`` runs the whole shipped catalog (invariants/checking/catalog/*.yaml: memory
and scheduler rules) at level 2 at every engine event, so the first violation raises
``InvariantViolation`` naming the invariant; ``check_accounting`` is the bare ownership law
(each pool balances, empty census, <= 1 chunk in flight) for tests that call the memory
layer directly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
from allpairspy import AllPairs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.view import StateView
from invariants.checking.checker import Checker, CheckerHook, Level
from invariants.checking.loader import Catalog, load_catalog

CATALOG: Catalog = load_catalog()


def strict_hook() -> CheckerHook:
    """A fresh level-2 checker over the whole catalog, as an engine observer."""
    return CheckerHook(Checker(CATALOG, Level.STRICT))


class AccountingError(AssertionError):
    """The basic accounting did not hold at an event."""


def check_accounting(view: StateView) -> None:
    """Raise unless every pool balances, every census is empty and <= 1 chunk is in flight."""
    for p in view.pools:
        total = p.free + p.evictable + p.protected + p.session_held + p.request_owned
        c = p.census
        if total != p.capacity or c.duplicates or c.dangling or c.orphans or c.free_repeats:
            raise AccountingError(
                f"{view.event} @ step {view.step}, pool {p.name}: free={p.free} "
                f"evictable={p.evictable} protected={p.protected} "
                f"request_owned={p.request_owned} sum={total} capacity={p.capacity}; "
                f"census dup={c.duplicates} dangling={c.dangling} orphans={c.orphans} "
                f"free_repeats={c.free_repeats}"
            )
    if len(view.sched.chunked_rids) > 1:
        raise AccountingError(
            f"step {view.step}: several chunked requests in flight {view.sched.chunked_rids}"
        )


def prompts(
    seed: int, n: int, shared: int, low: int, high: int, vocab: int = 256
) -> list[list[int]]:
    """``n`` prompts: a random-length head of one shared prefix (so the radix cache hits),
    then a random suffix of ``low..high`` tokens."""
    rng = np.random.default_rng(seed)
    head = rng.integers(0, vocab, shared).tolist()
    return [
        head[: int(rng.integers(0, shared + 1))]
        + rng.integers(0, vocab, int(rng.integers(low, high + 1))).tolist()
        for _ in range(n)
    ]


@dataclass(frozen=True, slots=True)
class Workload:
    """A pool, a chunk size and prompts sized for one page size: prompts longer than the chunk,
    a pool small enough that the cache evicts and decode retracts."""

    page_size: int
    max_total_tokens: int
    chunked_prefill_size: int
    max_new_tokens: int
    prompts: tuple[tuple[int, ...], ...]


def workload(page_size: int, seed: int = 0) -> Workload:
    if page_size >= 256:
        ps = prompts(seed, 10, 512, 64, 640)
        return Workload(page_size, 16 * page_size, 2 * page_size, 160, tuple(map(tuple, ps)))
    ps = prompts(seed, 16, 96, 16, 160)
    return Workload(page_size, 1024, 64, 64, tuple(map(tuple, ps)))


def grid_config(
    w: Workload,
    *,
    radix: bool,
    overlap: bool,
    mixed: bool,
    retract: bool,
    swa: bool = False,
    seed: int = 0,
    eos_prob: float = 0.0,
) -> EngineConfig:
    """The workload's engine; ``swa`` adds a sliding-window pool half the size of the full
    pool, with a window of two pages (at least 32 tokens)."""
    window = max(32, 2 * w.page_size)
    mem = MemoryConfig(
        page_size=w.page_size,
        max_total_tokens=w.max_total_tokens,
        max_num_reqs=16,
        context_len=1024,
        cache="radix" if radix else "chunk",
        swa_tokens=w.max_total_tokens // 2 if swa else None,
        sliding_window=window if swa else None,
    )
    return EngineConfig(
        memory=mem,
        seed=seed,
        chunked_prefill_size=w.chunked_prefill_size,
        enable_overlap=overlap,
        enable_mixed_chunk=mixed,
        test_retract=retract,
        eos_prob=eos_prob,
    )


def all_pairs(factors: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows covering every pair of values of every two factors (allpairspy, deterministic)."""
    names = list(factors)
    return [dict(zip(names, row)) for row in AllPairs([list(factors[n]) for n in names])]


F = TypeVar("F", bound=Callable[..., None])


def driving(method: F) -> F:
    """Mark a state machine broken while ``method`` drives the engine: if it raises, teardown
    leaves the engine alone (running on would bury the first failure under a later one)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        self.broken = True
        method(self, *args, **kwargs)
        self.broken = False

    return wrapper


class SteppingRules(RuleBasedStateMachine):
    """The rules every engine state machine shares: step a few times, and one step with a
    retract forced (subclasses provide ``self.engine``)."""

    engine: Engine

    @rule(n=st.integers(1, 8))
    @driving
    def step(self, n: int) -> None:
        for _ in range(n):
            self.engine.step()

    @rule()
    @driving
    def force_retract(self) -> None:
        """One step with SGLANG_TEST_RETRACT due now: if it decodes with more than one request
        running, it retracts."""
        step_with_forced_retract(self.engine)


def step_with_forced_retract(engine: Engine) -> None:
    """One step with SGLANG_TEST_RETRACT due now: a decode with more than one running
    request retracts."""
    sched = engine.scheduler
    normal = sched.config
    sched.config = replace(normal, test_retract=True, test_retract_interval=1)
    try:
        engine.step()
    finally:
        sched.config = normal


def run_checked(
    config: EngineConfig, w: Workload, observers: Sequence[Any] = ()
) -> tuple[Engine, Checker]:
    """Run the workload with the whole catalog checked at level 2 at every event (and any
    further ``observers``); returns the engine and its checker."""
    from engine.request import SamplingParams

    hook = strict_hook()
    engine = Engine(config, observers=[hook, *observers])
    for p in w.prompts:
        engine.submit(p, SamplingParams(max_new_tokens=w.max_new_tokens))
    engine.run_until_idle()
    return engine, hook.checker
