"""The tiny model over paged KV: tokens are a function of (seed, context) however the KV got
there; layers read KV from the pool (never recompute it); window layers read only the window;
MLA stores one latent per token; logprobs follow the sim model's semantics."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import numpy as np
import pytest
import torch

from engine.config.model import TinyConfig
from engine.mem.allocator import SWAAllocator
from engine.model.tiny import TinyModel
from engine.model.tiny_pools import make_kv_pool
from engine.request import Req

MakeDriver = Callable[..., Any]  # the SimDriver class from conftest.py

WINDOW = 5
CONFIGS: dict[str, tuple[TinyConfig, int | None]] = {
    "gqa": (TinyConfig(num_layers=2, num_heads=4, num_kv_heads=2), None),
    "mha": (
        TinyConfig(num_layers=2, num_heads=2, num_kv_heads=2, hidden_size=48, head_dim=12),
        None,
    ),
    "swa": (TinyConfig(num_layers=3, attention_pattern="SF"), WINDOW),
    "mla": (TinyConfig(num_layers=2, attention="mla"), None),
}
PROMPT = [7, 200, 13, 13, 99, 4, 250, 31, 64, 64, 1, 2, 3, 180, 45, 77, 9]


def tiny_driver(driver: MakeDriver, name: str, page_size: int = 1, seed: int = 0) -> Any:
    """A SimDriver whose model is the tiny model (hybrid pools for the window config)."""
    cfg, window = CONFIGS[name]
    d = driver(page_size=page_size, size=512, swa_size=256 if window else None, window=window)
    full_to_swa = d.alloc.full_to_swa if isinstance(d.alloc, SWAAllocator) else None
    d.sim = TinyModel(
        cfg,
        seed,
        make_kv_pool(cfg, d.alloc),
        page_size=page_size,
        sliding_window=window,
        full_to_swa=full_to_swa,
    )
    return d


def dense_continuation(driver: MakeDriver, name: str, prompt: list[int], num: int) -> list[int]:
    """No KV reuse at all: each next token from a fresh prefill of the whole context."""
    context = list(prompt)
    for _ in range(num):
        d = tiny_driver(driver, name)
        req = d.add("dense", context)
        d.extend([(req, len(context))])
        context.append(req.output_ids[-1])
    return context[len(prompt) :]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("page_size,chunk", [(1, 5), (4, 3), (4, 8)])
def test_paged_chunked_decode_equals_dense_recompute(
    driver: MakeDriver, name: str, page_size: int, chunk: int
) -> None:
    """Chunked prefill + decode over paged KV gives the tokens of recomputing the whole
    context at every step (no cache at all)."""
    d = tiny_driver(driver, name, page_size)
    got = d.generate("r", PROMPT, 6, chunk=chunk).output_ids
    assert got == dense_continuation(driver, name, PROMPT, 6)
    assert d.sim.padding_reads == 0


def test_weights_come_from_the_seed(driver: MakeDriver) -> None:
    """Same seed: same tokens and logprobs; another seed: another model."""
    runs = [tiny_driver(driver, "gqa", seed=s) for s in (3, 3, 4)]
    outs = [d.extend([(d.add("r", PROMPT), len(PROMPT))]) for d in runs]
    assert np.array_equal(outs[0].next_token_logprobs, outs[1].next_token_logprobs)
    assert torch.equal(runs[0].sim.weights.embed, runs[1].sim.weights.embed)
    assert not torch.equal(runs[0].sim.weights.embed, runs[2].sim.weights.embed)


@pytest.mark.parametrize("name", ["gqa", "mla"])
def test_prefix_kv_is_read_from_the_pool_not_recomputed(driver: MakeDriver, name: str) -> None:
    """Overwriting the KV of a prefix slot changes the next decode's logprob: the model reads
    the pool through ``req_to_token``."""
    twins = [tiny_driver(driver, name) for _ in range(2)]
    reqs = [d.generate("r", PROMPT, 2) for d in twins]
    slot = twins[1].slot(reqs[1], 3)
    pool = twins[1].sim.pool
    buffers = pool.kv_buffer if name == "mla" else pool.k_buffer
    for buf in buffers:
        buf[slot] = 3.0
    lps = [d.decode([r]).next_token_logprobs[0] for d, r in zip(twins, reqs)]
    assert abs(lps[0] - lps[1]) > 1e-6


def _swa_slots(d: Any, req: Req, lo: int, hi: int) -> np.ndarray:
    return d.alloc.full_to_swa[d.pool.read(req.req_pool_idx, lo, hi)]


def test_window_layers_read_exactly_the_window(driver: MakeDriver) -> None:
    """A decode at position q reads SWA KV at [q - W, q] only: poisoning every SWA slot
    before q - W changes nothing (not even by NaN); poisoning position q - W changes the
    logprob. The table never names a freed slot."""
    twins = [tiny_driver(driver, "swa", page_size=1) for _ in range(3)]
    reqs = [d.generate("r", PROMPT, 4) for d in twins]
    q = reqs[0].kv_committed_len  # the next decode's position
    swa = twins[1].sim.pool.swa
    outside = _swa_slots(twins[1], reqs[1], 0, q - WINDOW)
    for buf in swa.k_buffer + swa.v_buffer:
        buf[outside] = float("nan")
    edge = _swa_slots(twins[2], reqs[2], q - WINDOW, q - WINDOW + 1)
    for buf in twins[2].sim.pool.swa.k_buffer:
        buf[edge] = 3.0
    outs = [d.decode([r]) for d, r in zip(twins, reqs)]
    assert outs[0].next_token_ids[0] == outs[1].next_token_ids[0]
    assert outs[0].next_token_logprobs[0] == outs[1].next_token_logprobs[0]
    assert abs(outs[0].next_token_logprobs[0] - outs[2].next_token_logprobs[0]) > 1e-9


def test_freed_swa_kv_is_never_read(driver: MakeDriver) -> None:
    """Freeing the SWA slots that slid out of the window (what SWA eviction does) leaves the
    continuation unchanged and the model reports no padding reads."""
    kept, evicted = (tiny_driver(driver, "swa", page_size=1) for _ in range(2))
    reqs = [d.generate("r", PROMPT, 2) for d in (kept, evicted)]
    for _ in range(5):
        r = reqs[1]
        cut = r.kv_committed_len - WINDOW  # the next decode at q reads [q - W, q]
        evicted.alloc.free_swa(evicted.pool.read(r.req_pool_idx, 0, cut))
        for d, req in zip((kept, evicted), reqs):
            d.decode([req])
    assert reqs[0].output_ids == reqs[1].output_ids
    assert evicted.sim.padding_reads == 0


def test_window_layers_give_the_same_tokens_from_a_plain_pool(driver: MakeDriver) -> None:
    """Window layers over one plain pool (their window masked out of the full KV) sample the
    tokens they sample over a hybrid pool (window KV in the SWA pool, read via full_to_swa)."""
    cfg = CONFIGS["swa"][0]
    plain = driver(page_size=4, size=512)
    plain.sim = TinyModel(
        cfg, 0, make_kv_pool(cfg, plain.alloc), page_size=4, sliding_window=WINDOW
    )
    hybrid = tiny_driver(driver, "swa", page_size=4)
    outs = [d.generate("r", PROMPT, 8, chunk=6).output_ids for d in (plain, hybrid)]
    assert outs[0] == outs[1]
    assert plain.sim.swa_pool_layers == frozenset() and hybrid.sim.swa_pool_layers == {0, 2}


def test_mla_stores_one_latent_whose_head_is_the_value(driver: MakeDriver) -> None:
    """MLA: one ``[kv_lora_rank + rope_dim]`` latent per slot and layer; V aliases its head."""
    d = tiny_driver(driver, "mla")
    req = d.generate("r", PROMPT, 1)
    pool, cfg = d.sim.pool, CONFIGS["mla"][0]
    assert pool.kv_buffer[0].shape[1:] == (1, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    assert pool.get_value_buffer(0).data_ptr() == pool.get_key_buffer(0).data_ptr()
    slots = d.pool.read(req.req_pool_idx, 0, len(PROMPT))
    assert bool((pool.kv_buffer[1][slots].abs().sum(-1) > 0).all())


def _logprob_run(
    driver: MakeDriver, chunk: int, start: int = 0, decodes: int = 2
) -> tuple[Any, list[Any]]:
    d = tiny_driver(driver, "gqa")
    d.logprob_start["r"] = start
    req = d.add("r", PROMPT)
    outs = []
    while not req.output_ids:
        outs.append(d.extend([(req, chunk)]))
    outs += [d.decode([req]) for _ in range(decodes)]
    return req, outs


def test_input_logprobs_concatenate_over_chunks(driver: MakeDriver) -> None:
    """``input_token_logprobs`` holds log p(token p | [0, p)) for each written p >=
    logprob_start_len (NaN at p = 0): chunks concatenate to the whole extend, and a decode's
    input logprob is the previous step's sampled-token logprob."""
    _, whole = _logprob_run(driver, len(PROMPT))
    _, chunked = _logprob_run(driver, 4)
    cat = np.concatenate([o.input_token_logprobs[0] for o in chunked[:-2]])
    ref = whole[0].input_token_logprobs[0]
    assert len(ref) == len(PROMPT) and np.isnan(ref[0]) and np.isnan(cat[0])
    np.testing.assert_allclose(cat[1:], ref[1:], rtol=0, atol=1e-12)
    assert bool((ref[1:] < 0).all())
    for prev, dec in pairwise(whole):
        np.testing.assert_allclose(
            dec.input_token_logprobs[0], prev.next_token_logprobs, atol=1e-12
        )
    _, late = _logprob_run(driver, 4, start=6)
    assert [len(o.input_token_logprobs[0]) for o in late] == [0, 2, 4, 4, 1, 1, 1]
    np.testing.assert_allclose(
        np.concatenate([o.input_token_logprobs[0] for o in late[:5]]), ref[6:], atol=1e-12
    )


def test_lookback_token_survives_lagging_results(driver: MakeDriver) -> None:
    """Under overlap the request's ids may lag the KV: the token at ``prefix_len - 1`` then
    comes from what the model itself last wrote, and logprobs are unchanged."""
    outs = []
    for lag in (0, 2):
        d = tiny_driver(driver, "gqa")
        d.logprob_start["r"] = 0
        req = d.generate("r", PROMPT, 3)
        outs.append(d.decode([req], lag=lag))
    np.testing.assert_array_equal(outs[0].input_token_logprobs[0], outs[1].input_token_logprobs[0])
    assert outs[0].next_token_ids[0] == outs[1].next_token_ids[0]


def test_hidden_states_are_the_last_tokens_final_state(driver: MakeDriver) -> None:
    """``hidden_states`` is ``[bs, hidden]``: each request's last token's final-normed state,
    whose LM head gives the sampled token."""
    d = tiny_driver(driver, "gqa")
    a, b = d.add("a", PROMPT), d.add("b", PROMPT[:9])
    out = d.extend([(a, len(PROMPT)), (b, 9)])
    assert tuple(out.hidden_states.shape) == (2, CONFIGS["gqa"][0].hidden_size)
    logits = out.hidden_states @ d.sim.weights.lm_head
    assert logits.argmax(-1).tolist() == out.next_token_ids.tolist()


@pytest.mark.parametrize("name", ["gqa", "mla"])
def test_draft_agrees_with_the_target_only_sometimes(driver: MakeDriver, name: str) -> None:
    """The EAGLE draft maps (hidden at t, token at t + 1) to a guess of the token at t + 2:
    deterministic from the seed, right often enough and wrong often enough on text it was
    not fitted on that every accept length occurs."""
    d = tiny_driver(driver, name)
    hidden, tokens = [], []
    for i in range(6):
        req = d.add(f"r{i}", [(7 * i + 3 * j) % 256 for j in range(12 + i)])
        outs = [d.extend([(req, req.seqlen)])] + [d.decode([req]) for _ in range(24)]
        hidden.append(torch.cat([o.hidden_states for o in outs[:-1]]))
        tokens.append(np.concatenate([o.next_token_ids for o in outs]))
    guess = [d.sim.draft(h, t[:-1]) for h, t in zip(hidden, tokens)]
    agree = np.mean(np.concatenate([g.token_ids == t[1:] for g, t in zip(guess, tokens)]))
    assert 0.1 < agree < 0.8
    again = tiny_driver(driver, name).sim.draft(hidden[0], tokens[0][:-1])
    assert np.array_equal(again.token_ids, guess[0].token_ids)
    assert bool((guess[0].logprobs <= 0).all()) and guess[0].hidden.shape == hidden[0].shape
