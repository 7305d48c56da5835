"""Engine configuration: frozen, validated at construction, errors name the field.

Keeps: every config the engine runs with is internally consistent (pools hold at least one
page, windows and page sizes positive, a hybrid pool has a window, the running-request limit
fits the request rows, a chunk holds at least a page).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from engine.errors import ConfigError
from engine.model.tiny_config import TinyConfig
from engine.speculative.config import SpecConfig

CacheKind = Literal["radix", "chunk"]


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """KV memory: pool sizes in tokens, page size, prefix cache, SWA hybrid pools."""

    page_size: int = 1
    max_total_tokens: int = 4096
    max_num_reqs: int = 64
    context_len: int = 2048
    cache: CacheKind = "radix"
    swa_tokens: int | None = None  # a SWA pool of this many tokens makes the pools hybrid
    sliding_window: int | None = None
    strict: bool = True

    def __post_init__(self) -> None:
        _require(self.page_size >= 1, "page_size", self.page_size, "must be >= 1")
        _require(
            self.max_total_tokens >= self.page_size,
            "max_total_tokens",
            self.max_total_tokens,
            f"must hold at least one page ({self.page_size} tokens)",
        )
        _require(self.max_num_reqs >= 1, "max_num_reqs", self.max_num_reqs, "must be >= 1")
        _require(self.context_len >= 2, "context_len", self.context_len, "must be >= 2")
        _require(
            self.cache in ("radix", "chunk"), "cache", self.cache, "must be 'radix' or 'chunk'"
        )
        if self.swa_tokens is not None:
            _require(
                self.swa_tokens >= self.page_size,
                "swa_tokens",
                self.swa_tokens,
                "must hold at least one page",
            )
            _require(
                self.sliding_window is not None and self.sliding_window >= 1,
                "sliding_window",
                self.sliding_window,
                "a hybrid SWA pool needs a window >= 1",
            )

    @property
    def is_hybrid(self) -> bool:
        return self.swa_tokens is not None


def _require(ok: bool, name: str, value: object, why: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r}: {why}")


STRICT_ENV = "KVSPEC_STRICT"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine: memory, scheduler limits and modes, model, seed, checking level.

    Scheduler knobs carry SGLang's server-argument / environment names in their comments;
    the new-token-ratio schedule is SGLang's (init 0.7 × conservativeness, floor 0.14 × init,
    linear decay over 600 decode steps, reset to init when idle).
    """

    memory: MemoryConfig = MemoryConfig()
    seed: int = 0
    model: Literal["sim", "tiny"] = "sim"
    tiny: TinyConfig = TinyConfig()  # the tiny model's shape, dtype and backend (model="tiny")
    eos_prob: float = 0.0  # sim model: chance that a sampled token is EOS
    eos_token_ids: tuple[int, ...] = (257,)  # the byte tokenizer's EOS (tokenizer.EOS_ID)
    max_running_requests: int | None = None  # None: memory.max_num_reqs
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = 8192  # None: chunked prefill off
    enable_mixed_chunk: bool = False
    enable_overlap: bool = True  # SGLang's default (disable_overlap_schedule=False)
    enable_streaming_session: bool = (
        False  # --enable-streaming-session (engine/cache/streaming_session.py)
    )
    schedule_conservativeness: float = 1.0
    init_new_token_ratio_base: float = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
    min_new_token_ratio_factor: float = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    new_token_ratio_decay_steps: int = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    clip_max_new_tokens: int = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
    retract_decode_steps: int = 20  # SGLANG_RETRACT_DECODE_STEPS
    test_retract: bool = False  # SGLANG_TEST_RETRACT: force a retract every interval
    test_retract_interval: int = 3  # SGLANG_TEST_RETRACT_INTERVAL
    strict_level: int = 0  # 0 off, 1 record, 2 raise; KVSPEC_STRICT overrides
    speculative: SpecConfig | None = None  # EAGLE (engine/speculative/); None: off

    def __post_init__(self) -> None:
        mem = self.memory
        if self.max_running_requests is not None:
            _require(
                1 <= self.max_running_requests <= mem.max_num_reqs,
                "max_running_requests",
                self.max_running_requests,
                f"must be in 1..memory.max_num_reqs ({mem.max_num_reqs})",
            )
        _require(
            self.max_prefill_tokens >= 1,
            "max_prefill_tokens",
            self.max_prefill_tokens,
            "must be >= 1",
        )
        if self.chunked_prefill_size is not None:
            _require(
                self.chunked_prefill_size >= mem.page_size,
                "chunked_prefill_size",
                self.chunked_prefill_size,
                f"must hold a page ({mem.page_size} tokens) or be None",
            )
        _require(0.0 <= self.eos_prob <= 1.0, "eos_prob", self.eos_prob, "must be in [0, 1]")
        _require(
            self.schedule_conservativeness > 0,
            "schedule_conservativeness",
            self.schedule_conservativeness,
            "must be > 0",
        )
        _require(
            self.new_token_ratio_decay_steps >= 1,
            "new_token_ratio_decay_steps",
            self.new_token_ratio_decay_steps,
            "must be >= 1",
        )
        _require(
            self.test_retract_interval >= 1,
            "test_retract_interval",
            self.test_retract_interval,
            "must be >= 1",
        )
        _require(
            self.retract_decode_steps >= 0,
            "retract_decode_steps",
            self.retract_decode_steps,
            "must be >= 0",
        )
        _require(
            self.clip_max_new_tokens >= 1,
            "clip_max_new_tokens",
            self.clip_max_new_tokens,
            "must be >= 1",
        )
        _require(
            self.strict_level in (0, 1, 2), "strict_level", self.strict_level, "must be 0, 1 or 2"
        )
        _require(self.model in ("sim", "tiny"), "model", self.model, "must be 'sim' or 'tiny'")
        if self.model == "tiny":
            self.tiny.check_memory(mem)
        spec = self.speculative
        if spec is not None:  # SGLang: spec v2 runs with the overlap scheduler, v1 without
            _require(
                self.enable_overlap == (spec.version == 2),
                "enable_overlap",
                self.enable_overlap,
                f"EAGLE v{spec.version} needs the overlap scheduler "
                f"{'on' if spec.version == 2 else 'off'}",
            )

    @property
    def running_limit(self) -> int:
        return (
            self.max_running_requests
            if self.max_running_requests is not None
            else self.memory.max_num_reqs
        )

    @property
    def init_new_token_ratio(self) -> float:
        return min(self.init_new_token_ratio_base * self.schedule_conservativeness, 1.0)

    @property
    def min_new_token_ratio(self) -> float:
        return min(self.init_new_token_ratio * self.min_new_token_ratio_factor, 1.0)

    @property
    def new_token_ratio_decay(self) -> float:
        return (
            self.init_new_token_ratio - self.min_new_token_ratio
        ) / self.new_token_ratio_decay_steps

    @property
    def max_req_len(self) -> int:
        """Longest prompt + completion (SGLang: min(context_len - 1, max_total_num_tokens - 1))."""
        return min(self.memory.context_len - 1, self.memory.max_total_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        """A prompt must be shorter than this (SGLang: ``max_req_len - 5``)."""
        return self.max_req_len - 5


def resolve_strict_level(config: EngineConfig, environ: Mapping[str, str] | None = None) -> int:
    """The checking level: ``KVSPEC_STRICT`` (0|1|2) when set, else ``config.strict_level``."""
    env = os.environ if environ is None else environ
    raw = env.get(STRICT_ENV)
    if raw is None or raw.strip() == "":
        return config.strict_level
    if raw.strip() not in ("0", "1", "2"):
        raise ConfigError(f"{STRICT_ENV}={raw!r}: must be 0, 1 or 2")
    return int(raw)
