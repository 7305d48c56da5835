"""``max_new_tokens: 0`` (SGLang's frontend sends it for prefix caching and ``select``): the
request is prefilled, samples one token nobody returns, and finishes by length at its
prefill's result with no output. A batch of such requests alone never decodes (SGLang's
``is_prefill_only``); one that rides with ordinary requests under overlap is in the decode
already launched when it finishes, which writes the KV of its sampled token — the one KV a
finished request may hold past what it returns. Checked at level 2 throughout.
"""

from __future__ import annotations

import pytest

from engine.request import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11, 12]]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
def test_a_prefill_only_batch_finishes_at_its_prefill_and_never_decodes(
    checked_engine, overlap: bool
) -> None:
    """Two requests that return nothing: one prefill batch, no decode, no output."""
    engine = checked_engine(page_size=1, enable_overlap=overlap)
    results = engine.generate(PROMPTS, SamplingParams(max_new_tokens=0))
    assert [r.output_ids for r in results] == [(), ()]
    assert [r.finish_reason.to_json() for r in results] == [{"type": "length", "length": 0}] * 2
    assert [r.prompt_tokens for r in results] == [5, 7]
    assert engine.scheduler.stats.decode_batches == 0
    assert engine.scheduler.stats.prefill_batches == 1


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_prefill_only_request_riding_with_ordinary_ones_returns_nothing(
    checked_engine, page_size: int
) -> None:
    """Beside a request that decodes, a prefill-only request still returns nothing (its one
    sampled token's KV, written by the launched decode, is released with it)."""
    engine = checked_engine(page_size=page_size, enable_overlap=True)
    params = [SamplingParams(max_new_tokens=0), SamplingParams(max_new_tokens=6)]
    empty, ordinary = engine.generate(PROMPTS, params)
    assert empty.output_ids == () and empty.completion_tokens == 0
    assert len(ordinary.output_ids) == 6
    assert engine.scheduler.stats.decode_batches > 0


@pytest.mark.parametrize("version", [1, 2])
def test_max_new_tokens_zero_under_eagle(checked_engine, version: int) -> None:
    """SGLang turns the prefill-only path off under speculative decoding; the request still
    returns nothing and the accounting stays exact."""
    engine = checked_engine(
        page_size=4, enable_overlap=version == 2, speculative={"version": version}
    )
    params = [SamplingParams(max_new_tokens=0), SamplingParams(max_new_tokens=5)]
    empty, ordinary = engine.generate(PROMPTS, params)
    assert empty.output_ids == () and len(ordinary.output_ids) == 5
