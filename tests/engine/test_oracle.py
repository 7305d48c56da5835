"""The oracle (docs/design.md decision 13): greedy output of the tiny model with every
cache feature on (radix cache, chunked prefill, mixed chunk, forced retract, overlap) equals
its output with every feature off (chunk cache, no chunking, no mixing, no retract, no
overlap), token for token — MHA, GQA, SWA (hybrid pools) and MLA, page sizes 1 and 16, on CPU
in float64. Each run also proves the features it claims really fired; a planted KV bug
breaks the equality; the Triton kernels give the torch backend's tokens."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from engine.config import EngineConfig, MemoryConfig
from engine.config.model import TinyConfig
from engine.config.speculative import SpecConfig
from engine.engine import Engine, GenerateResult
from engine.memory import KVMemory
from engine.model.tiny import TinyModel
from engine.request import SamplingParams

WINDOW = 8
MODELS: dict[str, TinyConfig] = {
    "mha": TinyConfig(num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=2, head_dim=16),
    "gqa": TinyConfig(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8),
    "swa": TinyConfig(num_layers=3, hidden_size=32, attention_pattern="SFS"),
    "mla": TinyConfig(num_layers=2, hidden_size=32, attention="mla"),
}
ON = {"cache": "radix", "mixed": True, "retract": True, "overlap": True, "chunked": True}
OFF = {"cache": "chunk", "mixed": False, "retract": False, "overlap": False, "chunked": False}


def _prompts(seed: int, n: int, shared: int, low: int, high: int) -> list[list[int]]:
    """Random byte prompts; each starts with a random-length head of one shared prefix."""
    rng = np.random.default_rng(seed)
    head = rng.integers(0, 256, shared).tolist()
    return [
        head[: int(rng.integers(0, shared + 1))]
        + rng.integers(0, 256, int(rng.integers(low, high + 1))).tolist()
        for _ in range(n)
    ]


PROMPTS = _prompts(0, 12, 64, 5, 48)
MAX_NEW = 32


@dataclass(slots=True)
class Witness:
    """Engine observer: the deepest SWA eviction any live request reached."""

    swa_evicted: int = 0
    events: list[str] = field(default_factory=list)

    def on_event(self, event: str, engine: Any) -> None:
        if event == "forward":
            evicted = (r.swa_evicted_seqlen for r in engine.scheduler.live_reqs())
            self.swa_evicted = max(self.swa_evicted, *evicted, 0)


def _config(
    model: str, page_size: int, f: dict[str, Any], tiny: TinyConfig | None = None
) -> EngineConfig:
    swa = model == "swa"
    # the features-on pool is small enough that the cache evicts; features off never retracts
    total = (512 if page_size == 1 else 2048) if f["retract"] else 4096
    mem = MemoryConfig(
        page_size=page_size,
        max_total_tokens=total,
        max_num_reqs=8,
        context_len=256,
        cache=f["cache"],
        swa_tokens=total // 2 if swa else None,
        sliding_window=WINDOW if swa else None,
    )
    return EngineConfig(
        memory=mem,
        seed=11,
        model="tiny",
        tiny=tiny or MODELS[model],
        chunked_prefill_size=max(16, 2 * page_size) if f["chunked"] else None,
        enable_mixed_chunk=f["mixed"],
        test_retract=f["retract"],
        enable_overlap=f["overlap"],
    )


def _run(
    config: EngineConfig, prompts: list[list[int]] = PROMPTS, max_new: int = MAX_NEW
) -> tuple[list[GenerateResult], Engine, Witness]:
    witness = Witness()
    engine = Engine(config, observers=[witness])
    results = engine.generate(prompts, SamplingParams(max_new_tokens=max_new))
    assert isinstance(engine.runner, TinyModel) and engine.runner.padding_reads == 0
    return results, engine, witness


def _tokens(results: list[GenerateResult]) -> list[tuple[tuple[int, ...], str]]:
    return [(r.output_ids, r.finish_reason.kind) for r in results]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("model", list(MODELS))
def test_every_cache_feature_on_gives_the_tokens_of_every_feature_off(
    model: str, page_size: int
) -> None:
    """Radix cache + chunked prefill + mixed chunk + retract + overlap produce exactly the
    greedy tokens of chunk cache, one-shot prefill, no mixing, no retract, no overlap; the
    features fired (cache hits, chunks, mixed batches, retracts; SWA eviction in hybrid
    pools) and no layer ever read a freed slot."""
    on, engine_on, seen_on = _run(_config(model, page_size, ON))
    off, engine_off, seen_off = _run(_config(model, page_size, OFF))
    assert _tokens(on) == _tokens(off)
    s = engine_on.stats
    assert s.cached_tokens > 0 and s.chunked_prefills > 0
    assert s.mixed_batches > 0 and s.retracted_reqs > 0
    assert engine_on.scheduler.overlap and not engine_off.scheduler.overlap
    t = engine_off.stats
    assert t.cached_tokens == t.chunked_prefills == t.mixed_batches == t.retracted_reqs == 0
    if model == "swa":
        assert seen_on.swa_evicted > 0 and seen_off.swa_evicted > 0
    assert sum(r.completion_tokens for r in on) > len(PROMPTS) * MAX_NEW // 2


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("model", ["gqa", "swa", "mla"])
def test_eagle_with_every_cache_feature_gives_the_tokens_of_every_feature_off(
    model: str, version: int
) -> None:
    """EAGLE (the tiny model's draft network, 3 steps) on top of radix cache + chunked prefill
    + retract (+ overlap for v2; SGLang turns mixed chunk off under EAGLE) gives exactly the
    features-off greedy tokens; the features fired, every accept length occurred."""
    config = replace(
        _config(model, 16, {**ON, "overlap": version == 2}), speculative=SpecConfig(version=version)
    )
    on, engine, seen = _run(config)
    off, _, _ = _run(_config(model, 16, OFF))
    assert _tokens(on) == _tokens(off)
    s = engine.stats
    assert (
        s.cached_tokens > 0
        and s.chunked_prefills > 0
        and s.retracted_reqs > 0
        and s.mixed_batches == 0
    )
    assert all(n > 0 for n in s.spec_accept_hist), s.spec_accept_hist
    assert seen.swa_evicted > 0 or model != "swa"


def test_a_planted_kv_bug_breaks_the_oracle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle has teeth: a prefix match whose first page names the second page's slots
    (stale KV read in place of the right one; swapping the two pages would NOT do: attention
    is permutation-invariant over keys roped at their own positions) changes the tokens."""
    clean, _, _ = _run(_config("gqa", 1, ON))
    match = KVMemory.match_prefix

    def swapped(self: KVMemory, req: Any) -> None:
        match(self, req)
        ps, idx = self.page_size, np.array(req.prefix_indices, copy=True)
        if len(idx) >= 2 * ps:
            idx[:ps] = idx[ps : 2 * ps]
            req.prefix_indices = idx

    monkeypatch.setattr(KVMemory, "match_prefix", swapped)
    planted, engine, _ = _run(_config("gqa", 1, ON))
    assert engine.stats.cached_tokens > 0
    assert _tokens(planted) != _tokens(clean)


def test_the_tiny_models_reads_are_checked_by_its_fingerprint_shadow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same planted stale page, seen at the forward that reads it: the tiny model's
    shadow records a kv.integrity failure naming the request, the position (in the first
    page) and the slot read; a clean run records none."""
    _, clean, _ = _run(_config("gqa", 1, ON))
    assert isinstance(clean.runner, TinyModel) and clean.runner.shadow is not None
    assert clean.runner.shadow.num_integrity_failures == 0
    match = KVMemory.match_prefix
    seen: list[Any] = []

    def swapped(self: KVMemory, req: Any) -> None:
        match(self, req)
        idx = np.array(req.prefix_indices, copy=True)
        if len(idx) >= 2:
            idx[0] = idx[1]
            req.prefix_indices = idx

    class Integrity:
        def on_event(self, event: str, engine: Any) -> None:
            if event == "forward":
                seen.extend(engine.state_view("forward").integrity)

    monkeypatch.setattr(KVMemory, "match_prefix", swapped)
    engine = Engine(_config("gqa", 1, ON), observers=[Integrity()])
    engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_NEW))
    assert seen and {f.position for f in seen} == {0} and seen[0].pool == "full"
    assert seen[0].expected != seen[0].found != 0


@pytest.mark.parametrize("model", ["swa", "mla"])
def test_triton_kernels_give_the_torch_backends_tokens(model: str) -> None:
    """At page size 4 in float32, the Triton kernels (interpreted on CPU: store, extend,
    decode, MLA decode, windowed through SWA slots) sample the torch backend's tokens."""
    prompts = _prompts(1, 3, 12, 3, 8)
    feats = {**ON, "retract": False}
    outs = []
    for backend in ("torch", "triton"):
        tiny = TinyConfig(
            num_layers=2,
            hidden_size=32,
            dtype="float32",
            backend=backend,
            attention="mla" if model == "mla" else "gqa",
            attention_pattern="FS" if model == "swa" else "F",
        )
        results, engine, _ = _run(_config(model, 4, feats, tiny), prompts, max_new=6)
        assert engine.stats.mixed_batches > 0 and engine.stats.decode_batches > 0
        outs.append(_tokens(results))
    assert outs[0] == outs[1]
