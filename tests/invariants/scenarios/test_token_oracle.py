"""The token oracle in the harness: every response's tokens equal the model's greedy tokens
for the same prompt from a scratch run with nothing cached (``response.tokens_match_uncached_
reference``) — the sim model always, the tiny model in float64 on the torch backend."""

from __future__ import annotations

from typing import Any

import pytest

from engine.engine import Engine
from engine.model.fingerprint import KVFingerprints
from engine.model.sim import SimModel
from engine.model.tiny import TinyModel
from engine.model.tokenizer import EOS_ID
from engine.request import Req
from invariants.checking.loader import shipped_catalog
from invariants.scenarios.runner import run_spec
from invariants.scenarios.spec import load_spec

ORACLE = "response.tokens_match_uncached_reference"


def test_the_sim_reference_is_the_context_function() -> None:
    """The sim model's reference after a prompt is its prediction chained token by token."""
    engine = Engine(load_spec("specs/matrix-base.yaml").engine.engine_config(0))
    model = engine.runner
    assert isinstance(model, SimModel)
    eos_heavy = SimModel(seed=3, kv=KVFingerprints(16), eos_prob=0.3)  # the EOS branch too
    for sim, n in ((model, 4), (eos_heavy, 40)):
        tokens = sim.reference([5, 6, 7], n)
        context = [5, 6, 7]
        for token in tokens:
            assert int(sim.predict([sim.context_hash(context)])[0][0]) == token
            context.append(token)
    assert EOS_ID in eos_heavy.reference([5, 6, 7], 40)


@pytest.mark.parametrize("dtype,checked", [("float64", True), ("float32", False)])
def test_the_tiny_reference_only_in_float64(dtype: str, checked: bool) -> None:
    """The tiny model offers a reference only where no reduction order can flip an argmax;
    the reference is its own scratch run of the prompt (greedy, nothing cached)."""
    spec = load_spec("specs/tiny-mla-sessions.yaml")
    tiny = {**spec.engine.tiny, "dtype": dtype}
    engine = Engine(spec.engine.model_copy(update={"tiny": tiny}).engine_config(0))
    assert isinstance(engine.runner, TinyModel)
    reference = engine.runner.reference(list(range(40, 60)), 5)
    assert (reference is not None) == checked
    if checked:
        assert reference is not None and len(reference) == 5
        assert engine.runner.cfg.dtype == "float64"


@pytest.mark.parametrize("spec", ["specs/streaming-sessions.yaml", "specs/tiny-mla-sessions.yaml"])
def test_a_wrong_token_fed_back_is_caught_by_the_token_oracle(
    spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler that records a different token than the model sampled (the third of each
    request) keeps every accounting rule balanced; the token oracle names the response. The
    correct engine passes it on the same spec."""
    assert run_spec(load_spec(spec), shipped_catalog()).ok
    real = Req.append_output

    def off_by_one(self: Req, token: int, logprob: float) -> None:
        real(self, (token + 1) % 256 if len(self.output_ids) == 2 else token, logprob)

    monkeypatch.setattr(Req, "append_output", off_by_one)
    out = run_spec(load_spec(spec), shipped_catalog())
    fired: set[Any] = {v.invariant for v in out.violations}
    assert ORACLE in fired
    first = next(v for v in out.violations if v.invariant == ORACLE)
    assert "uncached reference" in first.message
