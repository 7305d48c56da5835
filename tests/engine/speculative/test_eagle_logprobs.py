"""EAGLE returns a logprob for every token it returns: each accepted draft and the bonus get
the target's logprob from the verify's logits (what SGLang returns), so with
``return_logprob`` the output logprobs under v1 and v2 equal plain decoding's, token for
token — never a hole after the first token."""

from __future__ import annotations

import pytest

from engine.engine import Engine, GenerateResult
from engine.request import SamplingParams
from invariants.scenarios.spec import EngineSpec

PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7, 6, 5, 4, 3, 2, 1]]


def _run(**fields: object) -> list[GenerateResult]:
    engine = Engine(EngineSpec(page_size=4, **fields).engine_config(seed=3))
    rids = [
        engine.submit(p, SamplingParams(max_new_tokens=20), return_logprob=True) for p in PROMPTS
    ]
    while not engine.is_idle():
        engine.step()
    return [engine.pop_result(rid) for rid in rids]


@pytest.mark.parametrize("version", [1, 2])
def test_every_speculative_token_has_the_targets_logprob(version: int) -> None:
    plain = _run(enable_overlap=True)
    spec = _run(enable_overlap=version == 2, speculative={"version": version})
    for p, s in zip(plain, spec):
        assert s.output_ids == p.output_ids
        assert len(s.output_token_logprobs) == len(s.output_ids) == 20
        assert s.output_token_logprobs == pytest.approx(p.output_token_logprobs)
