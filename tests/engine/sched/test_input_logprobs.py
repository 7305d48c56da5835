"""Prompt logprobs (SGLang's ``input_token_logprobs``): with ``return_logprob`` and a
``logprob_start_len``, every prompt token from that position on gets the model's logprob
given the tokens before it. The prefix match stops at the start (SGLang: the span is
recomputed even when cached), so a cached prompt, a chunked prefill and a plain one agree;
without a start (-1) none are returned. Checked at level 2."""

from __future__ import annotations

import pytest

from engine.engine import GenerateResult
from engine.request import SamplingParams

PROMPT = list(range(1, 41))


def _scored(engine, start: int) -> GenerateResult:
    rid = engine.submit(
        PROMPT, SamplingParams(max_new_tokens=2), return_logprob=True, logprob_start_len=start
    )
    while not engine.is_idle():
        engine.step()
    return engine.pop_result(rid)


@pytest.mark.parametrize("model", ["sim", "tiny"])
def test_prompt_logprobs_agree_cached_chunked_and_plain(checked_engine, model: str) -> None:
    plain = _scored(checked_engine(page_size=4, model=model), 5)
    assert plain.input_token_ids == tuple(PROMPT[5:]) and len(plain.input_token_logprobs) == 35
    chunked = checked_engine(page_size=4, model=model, chunked_prefill_size=16)
    chunked.generate([PROMPT], SamplingParams(max_new_tokens=2))  # the prompt is now cached
    again = _scored(chunked, 5)
    assert again.cached_tokens == 4  # the match stopped at the start (page-aligned)
    assert again.input_token_logprobs == pytest.approx(plain.input_token_logprobs)


def test_without_a_start_only_the_output_is_scored(checked_engine) -> None:
    result = _scored(checked_engine(page_size=1), -1)
    assert result.input_token_logprobs == () and len(result.output_token_logprobs) == 2
