"""One timed run of one `kvspec bench sim` cell: a fresh sim-model engine, warm-up steps, then
timed steps, with the checker hook and the view builder's census timed apart.

Keeps: only ``Engine.step()`` is timed (``perf_counter_ns`` around each call), after warm-up,
with the waiting queue topped up between steps, outside the timed region; the census timer
wraps the view builder's census calls only while the timed steps run, and restores them.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.request import SamplingParams
from invariants.checking.checker import Checker, Level, ViewSource
from invariants.checking.rule import Rule
from invariants.scenarios.workload import TraceRequest, TraceShape

# the view builder's census calls: the incremental census of an engine's full pool, and the
# from-scratch one (hybrid SWA pools; the incremental one's fallback is not counted twice)
CENSUS_SITES: tuple[tuple[str, str], ...] = (
    ("engine.observe.memory_view", "take_census"),
    ("engine.observe.memory_view", "incremental_census"),
)


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """How each cell is run: timed steps and warm-up steps per run, runs per cell."""

    seed: int = 0
    steps: int = 300
    warmup: int = 50
    runs: int = 3
    page_size: int = 1


@dataclass(slots=True, eq=False)
class TimedHook:
    """The checker hook (``CheckerHook``), timing the view build and the rule evaluation apart."""

    checker: Checker
    views: int = 0
    view_ns: int = 0
    rules_ns: int = 0

    def on_event(self, event: str, engine: ViewSource) -> None:
        if self.checker.wants(event):
            start = time.perf_counter_ns()
            view = engine.state_view(event, self.checker.view_parts(event))
            built = time.perf_counter_ns()
            self.checker.check(event, view)
            self.views += 1
            self.view_ns += built - start
            self.rules_ns += time.perf_counter_ns() - built


@dataclass(slots=True, eq=False)
class CensusTimer:
    """Time spent in the census inside the view builder (``calls == 0``: not found)."""

    ns: int = 0
    calls: int = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns += time.perf_counter_ns() - start
                self.calls += 1

        return timed


@contextmanager
def census_timer() -> Iterator[CensusTimer]:
    """Measurement only: wraps the view builder's census call while the block runs."""
    timer, saved = CensusTimer(), []
    for module_name, attr in CENSUS_SITES:
        module = import_module(module_name)
        if hasattr(module, attr):
            saved.append((module, attr, getattr(module, attr)))
            setattr(module, attr, timer.wrap(getattr(module, attr)))
    try:
        yield timer
    finally:
        for module, attr, original in saved:
            setattr(module, attr, original)


@dataclass(slots=True, eq=False)
class Feeder:
    """Submits trace requests so that ``target`` requests wait before every step."""

    engine: Engine
    trace: Iterator[TraceRequest]
    target: int
    starved: bool = False

    def top_up(self) -> None:
        while len(self.engine.scheduler.waiting_queue) < self.target:
            req = next(self.trace, None)
            if req is None:
                self.starved = True
                return
            params = SamplingParams(max_new_tokens=req.max_new_tokens, ignore_eos=True)
            self.engine.submit(list(req.input_ids), params, rid=req.rid)


@dataclass(slots=True)
class RunSample:
    """One run of one cell: totals over the timed steps."""

    steps: int = 0
    step_ns: int = 0
    views: int = 0
    view_ns: int = 0
    rules_ns: int = 0
    census_ns: int = 0
    census_calls: int = 0
    running_sum: int = 0
    launched_sum: int = 0
    decode_steps: int = 0
    tree_nodes: int = 0
    starved: bool = False
    integrity_failures: int = 0
    samples_ns: list[int] = field(default_factory=list)


def make_engine(batch: int, pool: int, shape: TraceShape, settings: BenchSettings) -> Engine:
    """The sim-model engine of one cell (SGLang defaults: overlap on, radix cache)."""
    memory = MemoryConfig(
        page_size=settings.page_size,
        max_total_tokens=pool,
        max_num_reqs=2 * batch,
        context_len=shape.max_context + 8,
    )
    return Engine(EngineConfig(memory=memory, seed=settings.seed, max_running_requests=batch))


def run_once(
    batch: int,
    pool: int,
    rules: tuple[Rule, ...],
    trace: list[TraceRequest],
    settings: BenchSettings,
    shape: TraceShape,
) -> RunSample:
    """A fresh engine: warm-up steps, then ``settings.steps`` timed steps."""
    engine = make_engine(batch, pool, shape, settings)
    hook = TimedHook(Checker(rules, Level.STRICT)) if rules else None
    if hook is not None:
        engine.attach(hook)
    feeder = Feeder(engine, iter(trace), batch)
    for _ in range(settings.warmup):
        feeder.top_up()
        engine.step()
    sample = RunSample()
    base_views, base_view, base_rules = (
        (hook.views, hook.view_ns, hook.rules_ns) if hook else (0, 0, 0)
    )
    gc.collect()
    with census_timer() as census:
        _timed_steps(engine, feeder, settings.steps, sample)
    sample.views = hook.views - base_views if hook else 0
    sample.view_ns = hook.view_ns - base_view if hook else 0
    sample.rules_ns = hook.rules_ns - base_rules if hook else 0
    sample.census_ns, sample.census_calls = census.ns, census.calls
    sample.starved = feeder.starved
    sample.tree_nodes = len(engine.state_view().tree.nodes)
    sample.integrity_failures = int(getattr(engine.runner, "num_integrity_failures", 0))
    return sample


def _timed_steps(engine: Engine, feeder: Feeder, steps: int, sample: RunSample) -> None:
    sched, clock = engine.scheduler, time.perf_counter_ns
    for _ in range(steps):
        feeder.top_up()
        start = clock()
        engine.step()
        elapsed = clock() - start
        sample.samples_ns.append(elapsed)
        sample.step_ns += elapsed
        sample.steps += 1
        batch = sched.cur_batch
        sample.running_sum += sched.running_batch.batch_size()
        sample.launched_sum += 0 if batch is None else batch.batch_size()
        sample.decode_steps += batch is not None and not batch.is_extend
