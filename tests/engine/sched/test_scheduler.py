"""Scheduler behaviour end to end (engine + sim model): the feature grid, determinism, the
overlap commit offset, chunked prefill, mixed chunk, retract, SWA eviction."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from typing import Any

import pytest
from sched_support import (
    CATALOG,
    Workload,
    all_pairs,
    grid_config,
    prompts,
    run_checked,
    strict_hook,
    workload,
)

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.model.runner import ForwardMode
from engine.request import SamplingParams
from engine.view import view_to_dict

# all-pairs (allpairspy is not in the venv: sched_support.all_pairs, greedy) — 8 rows
GRID = all_pairs(
    {
        "page_size": [1, 4, 16, 256],
        "radix": [True, False],
        "overlap": [False, True],
        "mixed": [False, True],
        "retract": [False, True],
        "swa": [False, True],
    }
)


@cache
def reference_outputs(page_size: int) -> tuple[tuple[int, ...], ...]:
    """The workload's outputs with every scheduling feature off and a pool that never fills."""
    w = workload(page_size)
    mem = MemoryConfig(
        page_size=1, max_total_tokens=32768, max_num_reqs=16, context_len=1024, cache="chunk"
    )
    engine = Engine(EngineConfig(memory=mem, chunked_prefill_size=None, enable_overlap=False))
    results = engine.generate(
        [list(p) for p in w.prompts], SamplingParams(max_new_tokens=w.max_new_tokens)
    )
    return tuple(r.output_ids for r in results)


def _outputs(engine: Engine, n: int) -> tuple[tuple[int, ...], ...]:
    return tuple(engine.pop_result(f"req-{i}").output_ids for i in range(n))


@pytest.mark.parametrize("row", GRID, ids=lambda r: "-".join(f"{k}={int(v)}" for k, v in r.items()))
def test_feature_grid_keeps_accounting_and_fires_every_feature(row: dict[str, Any]) -> None:
    """Every pair of (page size, radix, overlap, mixed chunk, forced retract, SWA pools) runs
    prompts longer than the chunk through a pool that must evict and retract: every invariant
    of the catalog (memory and scheduler, KV integrity included; an ``engine.*`` crash rule
    only when something raises) is evaluated and holds at
    level 2 at every event, each enabled feature fired, and the outputs equal those of a run
    with every feature off (the sim model's token is a function of the context only, so
    scheduling must not change it)."""
    w = workload(row["page_size"])
    engine, checker = run_checked(
        grid_config(
            w,
            radix=row["radix"],
            overlap=row["overlap"],
            mixed=row["mixed"],
            retract=row["retract"],
            swa=row["swa"],
        ),
        w,
    )
    assert checker.violations == []
    steady = {r.id for r in CATALOG if r.events != {"crash"}}  # crash rules need an exception
    assert {rid for rid, st in checker.stats().items() if st.evaluations} == steady
    s = engine.stats
    assert s.chunked_prefills > 0
    assert s.evicted_tokens > 0 if row["radix"] else s.evicted_tokens == 0
    assert s.retracted_reqs > 0 if row["retract"] else True
    assert s.mixed_batches > 0 if row["mixed"] else s.mixed_batches == 0
    assert engine.runner.num_integrity_failures == 0
    assert _outputs(engine, len(w.prompts)) == reference_outputs(row["page_size"])


def test_memory_pressure_retracts_without_test_mode() -> None:
    """A pool too small for every admitted request's full decode makes the decode step retract
    (no forced retract), and the retracted requests still produce the reference outputs."""
    w = workload(4)
    tight = Workload(4, 640, w.chunked_prefill_size, 96, w.prompts)
    mem = MemoryConfig(
        page_size=4, max_total_tokens=tight.max_total_tokens, max_num_reqs=16, context_len=1024
    )
    engine = Engine(EngineConfig(memory=mem, chunked_prefill_size=64), observers=[strict_hook()])
    results = engine.generate([list(p) for p in w.prompts], SamplingParams(max_new_tokens=96))
    assert engine.stats.retracted_reqs > 0 and engine.stats.retract_rounds > 0
    assert all(r.completion_tokens == 96 for r in results)


def _digests(seed: int) -> list[str]:
    class Recorder:
        def __init__(self) -> None:
            self.digests: list[str] = []

        def on_event(self, event: str, engine: Any) -> None:
            if event == "step":
                data = json.dumps(view_to_dict(engine.state_view(event)), sort_keys=True)
                self.digests.append(hashlib.sha256(data.encode()).hexdigest())

    w = workload(4, seed=seed)
    recorder = Recorder()
    engine = Engine(
        grid_config(
            w, radix=True, overlap=True, mixed=True, retract=True, seed=seed, eos_prob=0.05
        ),
        observers=[recorder],
    )
    engine.generate([list(p) for p in w.prompts], SamplingParams(max_new_tokens=w.max_new_tokens))
    return recorder.digests


def test_same_seed_gives_identical_step_digests() -> None:
    """Two runs from one seed produce identical state-view digests at every step; another
    seed does not (the digests see the state)."""
    first, second = _digests(3), _digests(3)
    assert len(first) > 50 and first == second
    assert _digests(4) != first


@pytest.mark.parametrize("overlap", [False, True])
def test_committed_at_release_is_prompt_plus_completion_minus_one_without_overlap(
    overlap: bool,
) -> None:
    """At release, ``kv_committed_len == prompt + completion`` with overlap (the next decode
    step claimed the last token's KV before the finish was seen) and one less without."""
    mem = MemoryConfig(page_size=4, max_total_tokens=4096, max_num_reqs=8, context_len=1024)
    engine = Engine(EngineConfig(memory=mem, enable_overlap=overlap, eos_prob=0.1))
    rids = [
        engine.submit(p, SamplingParams(max_new_tokens=n))
        for p, n in zip(prompts(0, 4, 32, 8, 40), (1, 2, 7, 30))
    ]
    engine.run_until_idle()
    offset = 0 if overlap else 1
    for rid in rids:
        req, result = engine.requests[rid], engine.results[rid]
        assert req.kv_committed_freed and req.req_pool_idx is None
        assert req.kv_committed_len == result.prompt_tokens + result.completion_tokens - offset


def test_at_most_one_chunked_request_in_flight_and_it_keeps_its_row() -> None:
    """Regression (INV-CHUNKED-SINGLE, sglang#20476): with many long prompts, every batch
    carries at most one truncated chunk, at most one chunked request is in flight (checked by
    the accounting observer), and a request extended again without a retract in between is a
    continuing chunk: same row, starting exactly where its previous chunk ended."""
    last: dict[str, tuple[int, int, int]] = {}  # rid -> (retraction_count, row, seq_len)
    violations: list[str] = []

    class ChunkWatch:
        def on_event(self, event: str, engine: Any) -> None:
            batch = engine.scheduler.cur_batch
            if event != "schedule" or not batch.is_extend:
                return
            fb = batch.forward
            truncated = [r.rid for r, s in zip(fb.reqs, fb.sample) if not s]
            if len(truncated) > 1:
                violations.append(f"several truncated chunks {truncated}")
            n_ext = len(fb.reqs) - len(batch.decoding_reqs or ())
            for req, row, pre, seq in zip(
                fb.reqs[:n_ext],
                fb.req_pool_indices.tolist(),
                fb.prefix_lens.tolist(),
                fb.seq_lens.tolist(),
            ):
                prev = last.get(req.rid)
                if prev is not None and prev[0] == req.retraction_count and prev[1:] != (row, pre):
                    violations.append(
                        f"{req.rid}: extend at row {row} from {pre}, previous chunk {prev[1:]}"
                    )
                last[req.rid] = (req.retraction_count, row, seq)

    w = workload(16)
    for overlap in (False, True):
        engine = Engine(
            grid_config(w, radix=True, overlap=overlap, mixed=True, retract=True),
            observers=[ChunkWatch(), strict_hook()],
        )
        engine.generate([list(p) for p in w.prompts], SamplingParams(max_new_tokens=8))
        assert engine.stats.chunked_prefills > 0 and not violations
        last.clear()


def test_mixed_batch_puts_the_decodes_after_the_chunk() -> None:
    """Mixed chunk: the running requests' decode step rides in the prefill batch, after the
    extend part, one token each at position ``committed - 1``."""
    checked = []

    class MixedWatch:
        def on_event(self, event: str, engine: Any) -> None:
            batch = engine.scheduler.cur_batch
            if event == "schedule" and batch.mode is ForwardMode.MIXED:
                fb, n_dec = batch.forward, len(batch.decoding_reqs)
                assert fb.reqs[-n_dec:] == batch.decoding_reqs
                assert fb.extend_lens[-n_dec:].tolist() == [1] * n_dec
                assert fb.positions[-n_dec:].tolist() == [
                    r.kv_committed_len - 1 for r in batch.decoding_reqs
                ]
                checked.append(n_dec)

    w = workload(4)
    engine = Engine(
        grid_config(w, radix=True, overlap=False, mixed=True, retract=False),
        observers=[MixedWatch(), strict_hook()],
    )
    engine.generate([list(p) for p in w.prompts], SamplingParams(max_new_tokens=16))
    assert checked and engine.stats.mixed_batches == len(checked)


def test_forced_retract_fires_on_the_test_interval() -> None:
    """``test_retract`` (SGLANG_TEST_RETRACT) retracts whenever a decode step is scheduled
    with ``forward_ct % test_retract_interval == 0`` and more than one request runs."""
    rounds: list[int] = []

    class RetractWatch:
        last = 0

        def on_event(self, event: str, engine: Any) -> None:
            if event == "schedule" and engine.stats.retract_rounds > self.last:
                self.last = engine.stats.retract_rounds
                rounds.append(engine.scheduler.forward_ct)

    w = workload(1)
    mem = MemoryConfig(page_size=1, max_total_tokens=8192, max_num_reqs=16, context_len=1024)
    engine = Engine(
        EngineConfig(memory=mem, test_retract=True, test_retract_interval=4),
        observers=[RetractWatch()],
    )
    engine.generate([list(p) for p in w.prompts], SamplingParams(max_new_tokens=24))
    assert rounds and all(ct % 4 == 0 for ct in rounds)


def test_swa_decode_evicts_kv_outside_the_window() -> None:
    """Hybrid SWA pools: decode steps free the sliding-window KV that slid out of the window
    (``_evict_swa`` every ``sliding_window`` decode steps); both pools balance throughout."""
    cursors: list[int] = []

    class SwaWatch:
        def on_event(self, event: str, engine: Any) -> None:
            if event == "process":
                cursors.extend(r.swa_evicted_seqlen for r in engine.scheduler.running_batch.reqs)

    mem = MemoryConfig(
        page_size=4,
        max_total_tokens=2048,
        max_num_reqs=8,
        context_len=1024,
        swa_tokens=1024,
        sliding_window=16,
    )
    engine = Engine(
        EngineConfig(memory=mem, chunked_prefill_size=64), observers=[SwaWatch(), strict_hook()]
    )
    results = engine.generate(prompts(1, 6, 32, 40, 120), SamplingParams(max_new_tokens=80))
    assert max(cursors) > 0 and all(r.completion_tokens == 80 for r in results)
    assert engine.runner.num_integrity_failures == 0


def test_running_requests_never_exceed_the_limit() -> None:
    """``max_running_requests`` bounds the running batch plus the new prefill batch."""
    peak = []

    class Peak:
        def on_event(self, event: str, engine: Any) -> None:
            if event == "schedule":
                peak.append(len(engine.state_view(event).req_pool.rows_in_use))

    w = workload(1)
    mem = MemoryConfig(page_size=1, max_total_tokens=8192, max_num_reqs=16, context_len=1024)
    engine = Engine(EngineConfig(memory=mem, max_running_requests=3), observers=[Peak()])
    engine.generate([list(p) for p in w.prompts], SamplingParams(max_new_tokens=8))
    assert max(peak) == 3
