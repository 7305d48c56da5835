"""EngineConfig: the engine's whole configuration — memory, scheduler knobs and modes, model,
speculative decoding, seed, checking level — and the checking level's environment override.

Keeps: every config the engine runs with is internally consistent (the running-request
limit fits the request rows, a chunk holds at least a page, the model's layers fit the
memory's pools, EAGLE's version matches the overlap scheduler); the memory, model and
speculative parts validate themselves (memory.py, model.py, speculative.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from engine.config.memory import MemoryConfig, Problem, check_fields
from engine.config.model import TinyConfig
from engine.config.speculative import SpecConfig
from engine.errors import ConfigError

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
        check_fields(self, self._problems())
        if self.model == "tiny":
            self.tiny.check_memory(self.memory)
        spec = self.speculative
        if spec is not None and self.enable_overlap != (spec.version == 2):
            # SGLang: spec v2 runs with the overlap scheduler, v1 without
            why = f"EAGLE v{spec.version} needs the overlap scheduler "
            check_fields(self, [("enable_overlap", why + ("on" if spec.version == 2 else "off"))])

    def _problems(self) -> Iterator[Problem]:
        mem, running = self.memory, self.max_running_requests
        if running is not None and not 1 <= running <= mem.max_num_reqs:
            yield "max_running_requests", f"must be in 1..memory.max_num_reqs ({mem.max_num_reqs})"
        if self.max_prefill_tokens < 1:
            yield "max_prefill_tokens", "must be >= 1"
        chunk = self.chunked_prefill_size
        if chunk is not None and chunk < mem.page_size:
            yield "chunked_prefill_size", f"must hold a page ({mem.page_size} tokens) or be None"
        if not 0.0 <= self.eos_prob <= 1.0:
            yield "eos_prob", "must be in [0, 1]"
        if self.schedule_conservativeness <= 0:
            yield "schedule_conservativeness", "must be > 0"
        for name in ("new_token_ratio_decay_steps", "test_retract_interval"):
            if getattr(self, name) < 1:
                yield name, "must be >= 1"
        if self.retract_decode_steps < 0:
            yield "retract_decode_steps", "must be >= 0"
        if self.clip_max_new_tokens < 1:
            yield "clip_max_new_tokens", "must be >= 1"
        if self.strict_level not in (0, 1, 2):
            yield "strict_level", "must be 0, 1 or 2"
        if self.model not in ("sim", "tiny"):
            yield "model", "must be 'sim' or 'tiny'"

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
