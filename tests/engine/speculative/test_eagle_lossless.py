"""EAGLE is lossless: greedy output with speculative decoding (v1 or v2) equals greedy
output without it, token for token and finish reason for finish reason — the sim model over
many seeds, prompt and generation lengths, draft lengths and acceptance rates (stop tokens
included), the tiny model with its draft network; and the drafts really disagree: the
seeded acceptance process hits every accept length at the configured rate."""

from __future__ import annotations

import numpy as np
import pytest

from engine.engine import Engine
from engine.request import SamplingParams
from tests.engine.speculative.spec_support import prompts, run_strict, small_config, tokens

CASES = [  # (seed, num_steps, accept_prob, page_size, max_new, eos_prob)
    (0, 1, 0.5, 1, 24, 0.0),
    (1, 2, 0.7, 4, 40, 0.02),
    (2, 3, 0.9, 16, 17, 0.0),
    (3, 4, 0.6, 1, 33, 0.05),
    (4, 5, 0.8, 4, 9, 0.0),
    (5, 3, 0.3, 256, 50, 0.01),
    (6, 2, 1.0, 4, 31, 0.0),
    (7, 6, 0.75, 8, 64, 0.03),
]


def _plain(seed: int, page_size: int, eos_prob: float, ps: list[list[int]], max_new: int) -> list:
    config = small_config(None, page_size=page_size, seed=seed, eos_prob=eos_prob, total=4096)
    return tokens(Engine(config).generate(ps, SamplingParams(max_new_tokens=max_new)))


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=[f"seed{c[0]}" for c in CASES])
def test_greedy_output_with_eagle_equals_plain_decode(version: int, case: tuple) -> None:
    """Sim model: every request's tokens and finish reason with EAGLE equal those of plain
    greedy decoding (the target decides every token; drafts only propose)."""
    seed, steps, p, page_size, max_new, eos = case
    ps = prompts(seed, 10, 48, 1, 90)
    config = small_config(
        version,
        page_size=page_size,
        seed=seed,
        eos_prob=eos,
        total=4096,
        num_steps=steps,
        accept_prob=p,
        retract=seed % 2 == 1,
    )
    results, engine = run_strict(config, ps, max_new)
    assert tokens(results) == _plain(seed, page_size, eos, ps, max_new)
    assert sum(engine.stats.spec_accept_hist) > 0


def test_sim_draft_accepts_at_the_configured_rate() -> None:
    """The seeded draft proposes the target's token with probability p per position: the
    histogram of accepted drafts follows P(a = k) = p^k (1 - p) (k < steps), P(steps) =
    p^steps, every length occurs, and accept_prob 1 accepts every draft."""
    ps = prompts(11, 16, 32, 4, 40)
    steps, p = 4, 0.6
    _, engine = run_strict(small_config(2, num_steps=steps, accept_prob=p, total=8192), ps, 200)
    hist = np.array(engine.stats.spec_accept_hist, dtype=float)
    expected = np.array([p**k * (1 - p) for k in range(steps)] + [p**steps])
    assert (hist > 0).all() and hist.sum() > 500
    assert np.abs(hist / hist.sum() - expected).max() < 0.05
    _, sure = run_strict(small_config(1, num_steps=steps, accept_prob=1.0), ps[:4], 40)
    assert sure.stats.spec_accept_hist[:-1] == (0,) * steps and sure.stats.spec_accept_hist[-1] > 0


def test_the_same_seed_gives_the_same_acceptance() -> None:
    """The draft's coins are a function of seed and context only: two runs of one config
    give the same histogram; another seed gives another."""
    ps = prompts(3, 6, 16, 4, 30)
    hists = [
        run_strict(small_config(2, seed=s), ps, 40)[1].stats.spec_accept_hist for s in (5, 5, 6)
    ]
    assert hists[0] == hists[1] != hists[2]


@pytest.mark.parametrize("version", [1, 2])
def test_tiny_model_with_its_draft_network_is_lossless(version: int) -> None:
    """Tiny model (float64, GQA, page size 4, retract on): EAGLE with the distilled draft
    network gives the plain greedy tokens, and its drafts are accepted 0..num_steps times."""
    from engine.config.model import TinyConfig

    tiny = TinyConfig(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8)
    ps = prompts(0, 6, 16, 5, 40)
    on, engine = run_strict(
        small_config(version, model="tiny", tiny=tiny, retract=True, seed=11), ps, 24
    )
    off = Engine(small_config(None, model="tiny", tiny=tiny, seed=11)).generate(
        ps, SamplingParams(max_new_tokens=24)
    )
    assert tokens(on) == tokens(off)
    assert all(n > 0 for n in engine.stats.spec_accept_hist) and engine.stats.retracted_reqs > 0
