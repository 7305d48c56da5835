"""ServerArgs: the ``kvspec serve`` flags (SGLang's server-argument names) and the
EngineConfig they build.

Keeps: every flag maps to one engine field; a combination the engine rejects raises
``ConfigError`` naming the flag. Mappings that are not one-to-one:
    --speculative-algorithm EAGLE     EAGLE v1; overlap off (SGLang disables it for spec v1)
    --speculative-algorithm EAGLE_V2  EAGLE v2; needs overlap (no --disable-overlap-schedule)
    --attention swa                   a hybrid SWA pool of swa_full_tokens_ratio × the full pool,
                                      window --sliding-window (tiny: layers F,S alternate)
    --attention mha | mla             tiny model: GQA with as many KV heads as heads | MLA
                                      (the sim model's KV is a fingerprint either way)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from engine.config import EngineConfig, MemoryConfig
from engine.config.model import TinyConfig
from engine.config.speculative import SpecConfig
from engine.errors import ConfigError

SPEC_VERSIONS: dict[str, Literal[1, 2]] = {"EAGLE": 1, "EAGLE_V2": 2}


@dataclass(frozen=True, slots=True)
class ServerArgs:
    host: str = "127.0.0.1"
    port: int = 30000
    model: Literal["sim", "tiny"] = "sim"
    seed: int = 0
    page_size: int = 1
    chunked_prefill_size: int | None = 8192
    enable_mixed_chunk: bool = False
    disable_overlap_schedule: bool = False
    enable_streaming_session: bool = False
    enable_session_radix_cache: bool = False
    speculative_algorithm: Literal["EAGLE", "EAGLE_V2"] | None = None
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 4
    attention: Literal["mha", "swa", "mla"] = "mha"
    sliding_window: int = 64
    swa_full_tokens_ratio: float = 0.8
    max_running_requests: int | None = None
    max_num_reqs: int = 256
    context_length: int = 2048
    max_total_tokens: int = 16384
    test_retract: bool = False  # SGLang's SGLANG_TEST_RETRACT
    strict_mem_check: Literal[0, 1, 2] = 1
    api_key: str | None = None

    def __post_init__(self) -> None:
        choices = {
            "model": ("sim", "tiny"),
            "attention": ("mha", "swa", "mla"),
            "strict_mem_check": (0, 1, 2),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(
                    f"{name}={getattr(self, name)!r}: must be one of {', '.join(map(str, allowed))}"
                )

    def public(self) -> dict[str, Any]:
        """The arguments as ``/get_server_info`` shows them (the API key masked)."""
        return {**asdict(self), "api_key": None if self.api_key is None else "***"}

    def engine_config(self) -> EngineConfig:
        """The EngineConfig these flags describe (``ConfigError`` names a bad flag)."""
        if self.speculative_eagle_topk != 1:
            raise ConfigError(
                f"speculative_eagle_topk={self.speculative_eagle_topk}: only a top-1 chain (1)"
            )
        if self.speculative_algorithm not in (None, *SPEC_VERSIONS):
            raise ConfigError(
                f"speculative_algorithm={self.speculative_algorithm!r}: use EAGLE or EAGLE_V2"
            )
        version = SPEC_VERSIONS.get(self.speculative_algorithm or "")
        overlap = not self.disable_overlap_schedule and version != 1
        spec = (
            None
            if version is None
            else SpecConfig(
                num_steps=self.speculative_num_steps,
                num_draft_tokens=self.speculative_num_draft_tokens,
                version=version,
            )
        )
        return EngineConfig(
            memory=self._memory(),
            seed=self.seed,
            model=self.model,
            tiny=self._tiny(),
            max_running_requests=self.max_running_requests,
            chunked_prefill_size=self.chunked_prefill_size,
            enable_mixed_chunk=self.enable_mixed_chunk,
            enable_overlap=overlap,
            enable_streaming_session=self.enable_streaming_session,
            test_retract=self.test_retract,
            strict_level=self.strict_mem_check,
            speculative=spec,
        )

    def _memory(self) -> MemoryConfig:
        swa = self.attention == "swa"
        if swa and not 0.0 < self.swa_full_tokens_ratio <= 1.0:
            raise ConfigError(
                f"swa_full_tokens_ratio={self.swa_full_tokens_ratio}: must be in (0, 1]"
            )
        swa_tokens = (
            int(self.max_total_tokens * self.swa_full_tokens_ratio)
            // self.page_size
            * self.page_size
        )
        return MemoryConfig(
            page_size=self.page_size,
            max_total_tokens=self.max_total_tokens,
            max_num_reqs=max(self.max_num_reqs, self.max_running_requests or 0),
            context_len=self.context_length,
            swa_tokens=swa_tokens if swa else None,
            sliding_window=self.sliding_window if swa else None,
            session_radix_cache=self.enable_session_radix_cache,
        )

    def _tiny(self) -> TinyConfig:
        if self.attention == "mla":
            return TinyConfig(attention="mla")
        if self.attention == "swa":
            return TinyConfig(attention_pattern="FS")
        return TinyConfig(num_kv_heads=TinyConfig().num_heads)  # MHA: one KV head per head
