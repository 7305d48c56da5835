"""SGLang's penalizers in both models (engine/model/penalties.py): ``min_new_tokens`` masks the
stop tokens (EOS included, ``ignore_eos`` or not) until that many tokens were output; the
frequency and presence penalties lower every token already output by ``f × count + p``; the
greedy token is the argmax after them. A penalized token is a function of the request's own
output, so the engine's tokens under every schedule equal the uncached reference's."""

from __future__ import annotations

import numpy as np
import pytest

from engine.engine import Engine
from engine.errors import ConfigError
from engine.model.fingerprint import KVFingerprints
from engine.model.penalties import Penalties
from engine.model.sim import SimModel
from engine.model.tokenizer import BOS_ID, EOS_ID
from engine.request import Req, SamplingParams
from invariants.scenarios.spec import EngineSpec

EOS = frozenset({EOS_ID})


def test_apply_masks_stops_until_the_minimum_and_subtracts_the_counts() -> None:
    """Scores ``[0, -1, -2, -3]``, stop token 0, minimum 2: token 0 is -inf after one token
    and free after two; frequency 0.5 and presence 0.25 lower token 1 (output twice) by 1.25."""
    scores = np.array([0.0, -1.0, -2.0, -3.0])
    pen = Penalties(min_new_tokens=2, stop_ids=frozenset({0, 99}), frequency=0.5, presence=0.25)
    assert pen.apply(scores, [3]).tolist() == [-np.inf, -1.0, -2.0, -3.0 - 0.75]
    assert pen.apply(scores, [1, 1]).tolist() == [0.0, -2.25, -2.0, -3.0]
    assert pen.pick(scores, [1]) == 1 and pen.pick(scores, [1, 1]) == 0
    assert scores.tolist() == [0.0, -1.0, -2.0, -3.0]  # the input is left as it was


def test_neutral_parameters_take_the_fast_path() -> None:
    """Only a request that asks for a penalizer gets Penalties (the models' slow path)."""
    assert Penalties.of(Req("a", [1], sampling_params=SamplingParams())) is None
    req = Req("b", [1], sampling_params=SamplingParams(min_new_tokens=3), eos_token_ids=EOS)
    assert Penalties.of(req) == Penalties(3, EOS, 0.0, 0.0)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"max_new_tokens": 2, "min_new_tokens": 3}, "min_new_tokens=3: must be in [0, "),
        ({"frequency_penalty": 2.5}, "frequency_penalty=2.5: must be in [-2, 2]"),
        ({"presence_penalty": -3.0}, "presence_penalty=-3.0: must be in [-2, 2]"),
    ],
)
def test_out_of_range_parameters_are_refused(fields: dict[str, float], message: str) -> None:
    """SGLang's ``SamplingParams.verify`` ranges, named in the error."""
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        SamplingParams(**fields)


def test_min_new_tokens_holds_off_an_always_eos_model() -> None:
    """A sim model whose every prediction is EOS: under ``min_new_tokens=5`` the first five
    tokens are the best non-stop tokens, then EOS ends the request (6 tokens, stop)."""
    engine = Engine(EngineSpec(eos_prob=1.0, enable_overlap=True).engine_config(0))
    prompt = [BOS_ID, 10, 20, 30]
    plain, held = engine.generate(
        [prompt, prompt],
        [SamplingParams(max_new_tokens=16), SamplingParams(max_new_tokens=16, min_new_tokens=5)],
    )
    assert plain.output_ids == (EOS_ID,) and plain.finish_reason.kind == "stop"
    assert len(held.output_ids) == 6 and held.output_ids[-1] == EOS_ID
    assert EOS_ID not in held.output_ids[:5] and held.finish_reason.matched == EOS_ID


def test_min_new_tokens_masks_eos_even_with_ignore_eos() -> None:
    """``ignore_eos`` keeps EOS from finishing a request, not from being sampled; the mask
    keeps it from being sampled (SGLang masks ``tokenizer.eos_token_id`` regardless)."""
    engine = Engine(EngineSpec(eos_prob=1.0).engine_config(0))
    params = SamplingParams(max_new_tokens=6, min_new_tokens=4, ignore_eos=True)
    (result,) = engine.generate([[BOS_ID, 1, 2]], params)
    assert EOS_ID not in result.output_ids[:4] and result.output_ids[4:] == (EOS_ID, EOS_ID)


def test_penalties_change_the_greedy_tokens_only_after_a_repeat() -> None:
    """Frequency and presence penalties of 2 (a token output twice loses 6, more than the sim
    model's score spread): the output agrees with the unpenalized one up to the first
    position where the unpenalized one repeats a token; no token is output three times."""
    sim = SimModel(seed=1, kv=KVFingerprints(16))
    prompt = [BOS_ID, *range(40, 48)]
    plain = sim.reference(prompt, 300)
    params = SamplingParams(max_new_tokens=300, frequency_penalty=2.0, presence_penalty=2.0)
    penalized = sim.reference(prompt, 300, Req("p", prompt, sampling_params=params))
    first_repeat = next(i for i, t in enumerate(plain) if t in plain[:i])
    assert penalized[:first_repeat] == plain[:first_repeat] != penalized[: first_repeat + 1]
    assert max(penalized.count(t) for t in set(penalized)) <= 2


CONFIGS = [
    {},
    {"enable_overlap": False, "page_size": 4, "test_retract": True},
    {"enable_mixed_chunk": True, "page_size": 16},
    {
        "enable_overlap": False,
        "speculative": {"version": 1, "num_steps": 3, "num_draft_tokens": 4, "accept_prob": 0.8},
    },
    {
        "speculative": {"version": 2, "num_steps": 3, "num_draft_tokens": 4, "accept_prob": 0.8},
        "test_retract": True,
    },
    {"model": "tiny", "tiny": {"dtype": "float64"}},
    {
        "model": "tiny",
        "tiny": {"dtype": "float64"},
        "enable_overlap": False,
        "speculative": {"version": 1, "num_steps": 2, "num_draft_tokens": 3},
    },
]


@pytest.mark.parametrize("fields", CONFIGS, ids=lambda f: ",".join(map(str, f)) or "default")
def test_every_schedule_returns_the_uncached_reference(fields: dict[str, object]) -> None:
    """Twelve penalized requests (chunked prompts, EOS drawn often) under overlap, retract,
    mixed chunks, EAGLE v1/v2 and the tiny transformer: each response equals the model's
    scratch reference under the same penalties, and no stop token comes before the minimum."""
    spec = EngineSpec(eos_prob=0.3, chunked_prefill_size=16, **fields)
    engine = Engine(spec.engine_config(0))
    rng = np.random.default_rng(0)
    prompts = [
        [BOS_ID, *rng.integers(0, 256, int(rng.integers(5, 40))).tolist()] for _ in range(12)
    ]
    params = [
        SamplingParams(
            max_new_tokens=24,
            min_new_tokens=(i % 3) * 8,
            frequency_penalty=(0.0, 0.7, 1.5)[i % 3],
            presence_penalty=(0.5, 0.0, -0.5)[(i // 3) % 3],
        )
        for i in range(12)
    ]
    eos = frozenset(engine.config.eos_token_ids)
    for prompt, sp, result in zip(prompts, params, engine.generate(prompts, params)):
        like = Req("like", prompt, sampling_params=sp, eos_token_ids=eos)
        reference = engine.runner.reference(prompt, len(result.output_ids), like)
        assert reference == list(result.output_ids)
        if result.finish_reason.kind == "stop":
            assert len(result.output_ids) > sp.min_new_tokens
