"""TinyConfig validation: a tiny model's layers must fit the memory layer's pools, and every
bad value is refused at construction with the field named."""

from __future__ import annotations

from typing import Any

import pytest

from engine.config import EngineConfig, MemoryConfig
from engine.config.model import TinyConfig
from engine.engine import Engine
from engine.errors import ConfigError
from engine.mem.kv_pool import MHAKVPool, MLAKVPool, SWAKVPool
from engine.model.tiny import TinyModel
from engine.request import SamplingParams

HYBRID = MemoryConfig(page_size=4, max_total_tokens=256, swa_tokens=128, sliding_window=8)
PLAIN = MemoryConfig(page_size=4, max_total_tokens=256)


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"num_heads": 4, "num_kv_heads": 3}, "num_kv_heads"),
        ({"head_dim": 7}, "head_dim"),
        ({"attention_pattern": "FX"}, "attention_pattern"),
        ({"attention_pattern": ""}, "attention_pattern"),
        ({"backend": "triton"}, "dtype"),  # float64 is the default dtype
        ({"attention": "mla", "attention_pattern": "S"}, "attention_pattern"),
        ({"dtype": "int8"}, "dtype"),
        ({"num_layers": 0}, "num_layers"),
    ],
)
def test_bad_values_are_refused_naming_the_field(kw: dict[str, Any], field: str) -> None:
    """Each invalid TinyConfig raises ConfigError naming ``tiny.<field>``."""
    with pytest.raises(ConfigError, match=f"tiny.{field}"):
        TinyConfig(**kw)


@pytest.mark.parametrize(
    "memory,tiny,why",
    [
        (HYBRID, TinyConfig(), "needs at least one sliding-window layer"),
        (PLAIN, TinyConfig(attention_pattern="FS"), "need memory.sliding_window"),
        (HYBRID, TinyConfig(attention="mla"), "MLA has no hybrid"),
    ],
)
def test_model_must_fit_the_pools(memory: MemoryConfig, tiny: TinyConfig, why: str) -> None:
    """EngineConfig(model="tiny") refuses a model whose layers do not match the pools."""
    with pytest.raises(ConfigError, match=why):
        EngineConfig(memory=memory, model="tiny", tiny=tiny)
    EngineConfig(memory=memory, tiny=tiny)  # the sim model ignores the tiny config


@pytest.mark.parametrize(
    "memory,tiny,pool",
    [
        (PLAIN, TinyConfig(), MHAKVPool),
        (HYBRID, TinyConfig(num_layers=4, attention_pattern="FS"), SWAKVPool),
        (PLAIN, TinyConfig(attention="mla"), MLAKVPool),
    ],
)
def test_engine_builds_the_tiny_runner_and_its_pool(
    memory: MemoryConfig, tiny: TinyConfig, pool: type
) -> None:
    """``model="tiny"`` makes the engine's default runner the tiny model over buffers as
    large as the allocator's pools (plus the padding page); window layers go to the SWA pool."""
    engine = Engine(EngineConfig(memory=memory, model="tiny", tiny=tiny))
    model = engine.runner
    assert isinstance(model, TinyModel) and isinstance(model.pool, pool)
    if isinstance(model.pool, SWAKVPool):
        assert model.pool.swa_layers == frozenset({1, 3})
        assert model.pool.swa.k_buffer[0].shape[0] == 128 + 4
        assert model.pool.full.k_buffer[0].shape[0] == 256 + 4
    result = engine.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=8))[0]
    assert result.completion_tokens == 8 or result.finish_reason.kind == "stop"
