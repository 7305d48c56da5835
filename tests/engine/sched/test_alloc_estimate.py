"""What a batch was decided on and what preparing it took (engine/sched/estimate.py): a
prefill's charge is each admitted prompt's page-ceiled extend plus a page, a decode step's the
pages its requests' next tokens open; the allocators' ``taken_tokens`` say what was taken."""

from __future__ import annotations

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.request import SamplingParams


def _engine(page_size: int, swa: bool = False) -> Engine:
    memory = MemoryConfig(
        page_size=page_size,
        max_total_tokens=256,
        max_num_reqs=4,
        context_len=128,
        swa_tokens=256 if swa else None,
        sliding_window=16 if swa else None,
    )
    return Engine(EngineConfig(memory=memory, enable_overlap=False))


def test_prefill_charge_covers_the_pages_taken() -> None:
    """A 6-token prompt at page size 4: charged ceil(6, 4) + 4 = 12 tokens, takes 2 pages (8)."""
    engine = _engine(4)
    engine.submit(list(range(1, 7)), SamplingParams(max_new_tokens=8, ignore_eos=True))
    engine.step()
    estimate = engine.scheduler.estimate
    assert (estimate.prefill, estimate.decode, estimate.allocated()) == (12, 0, (8,))


def test_decode_estimate_is_the_page_the_next_token_opens() -> None:
    """Page size 4, a 6-token prompt: positions 6, 7 fill its second page (estimate 0, nothing
    taken); position 8 opens the third (estimate 4, one page taken)."""
    engine = _engine(4)
    engine.submit(list(range(1, 7)), SamplingParams(max_new_tokens=8, ignore_eos=True))
    engine.step()  # the prefill: 6 tokens, the first output token sampled
    seen = []
    for _ in range(3):
        engine.step()
        estimate = engine.scheduler.estimate
        seen.append((estimate.estimated, estimate.allocated()))
    assert seen == [(0, (0,)), (0, (0,)), (4, (4,))]


def test_hybrid_pools_each_report_what_they_gave() -> None:
    """With an SWA pool, a prefill takes the same pages from both pools: (full, SWA)."""
    engine = _engine(4, swa=True)
    engine.submit(list(range(1, 10)), SamplingParams(max_new_tokens=2, ignore_eos=True))
    engine.step()
    assert engine.scheduler.estimate.allocated() == (12, 12)
    assert engine.scheduler.estimate.estimated == 16  # ceil(9, 4) + 4
