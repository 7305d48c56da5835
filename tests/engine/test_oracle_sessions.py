"""The oracle with streaming sessions: the tiny model's greedy turns inside a streaming
session — the KV of every earlier turn reused from the session slot, with the radix cache,
chunked prefill, mixed chunk, forced retract and overlap on — equal the outputs of sending
each turn's whole context (history + new input) with every cache feature off, token for
token; for GQA, SWA and MLA at page sizes 1 and 16, in float64."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.engine import Engine
from engine.request import SamplingParams
from tests.engine.test_oracle import OFF, ON, _config

TURNS = 3
MAX_NEW = 12


def _turn_inputs(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(rng.integers(6, 40))).tolist() for _ in range(TURNS)]


def _session_outputs(engine: Engine, inputs: list[list[int]]) -> list[list[int]]:
    sid = engine.open_session(1000, streaming=True)
    outputs = []
    for turn in inputs:
        (result,) = engine.generate(
            [turn],
            SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True),
            session_params={"id": sid},
        )
        assert result.finish_reason.kind == "length", result.finish_reason
        outputs.append(list(result.output_ids))
    engine.close_session(sid)
    return outputs


def _plain_outputs(engine: Engine, inputs: list[list[int]]) -> list[list[int]]:
    """Each turn sent without a session: the whole history, then the new input."""
    history: list[int] = []
    outputs = []
    for turn in inputs:
        (result,) = engine.generate(
            [history + turn], SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True)
        )
        outputs.append(list(result.output_ids))
        history = history + turn + list(result.output_ids)
    return outputs


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("model", ["gqa", "swa", "mla"])
def test_streaming_session_turns_equal_whole_context_without_cache(
    model: str, page_size: int
) -> None:
    """Session turns (slot KV inherited, all features on) == whole-context prompts, all off."""
    inputs = _turn_inputs(page_size * 7 + len(model))
    on = Engine(replace(_config(model, page_size, ON), enable_streaming_session=True))
    off = Engine(_config(model, page_size, OFF))
    with_session = _session_outputs(on, inputs)
    assert with_session == _plain_outputs(off, inputs)
    assert on.stats.cached_tokens > 0  # later turns really reused the session's KV
