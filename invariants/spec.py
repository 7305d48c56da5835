"""Scenario specs: YAML files under specs/ → validated Spec objects, errors with file:line.

Keeps: a spec that loads is runnable — unknown keys, bad types and values the engine's own
config rejects are reported as `path:line: reason` before anything runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.config import EngineConfig, MemoryConfig
from engine.errors import ConfigError
from engine.model.tiny_config import TinyConfig
from engine.speculative.config import SpecConfig
from invariants.loader import locate, read_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSpec(_Strict):
    """Engine knobs (SGLang's server-argument names where one exists)."""

    page_size: int = 1
    max_total_tokens: int = 4096
    max_num_reqs: int = 32
    context_len: int = 2048
    cache: Literal["radix", "chunk"] = "radix"
    swa_tokens: int | None = None
    sliding_window: int | None = None
    chunked_prefill_size: int | None = 8192
    enable_overlap: bool = True
    enable_mixed_chunk: bool = False
    test_retract: bool = False
    max_running_requests: int | None = None
    eos_prob: float = 0.0
    model: Literal["sim", "tiny"] = "sim"
    tiny: dict[str, Any] = {}  # TinyConfig fields (engine/model/tiny_config.py)
    speculative: dict[str, Any] | None = None  # SpecConfig fields (engine/speculative/config.py)

    def engine_config(self, seed: int) -> EngineConfig:
        memory = MemoryConfig(page_size=self.page_size, max_total_tokens=self.max_total_tokens,
                              max_num_reqs=self.max_num_reqs, context_len=self.context_len,
                              cache=self.cache, swa_tokens=self.swa_tokens,
                              sliding_window=self.sliding_window)
        return EngineConfig(memory=memory, seed=seed, eos_prob=self.eos_prob,
                            chunked_prefill_size=self.chunked_prefill_size,
                            enable_overlap=self.enable_overlap,
                            enable_mixed_chunk=self.enable_mixed_chunk, test_retract=self.test_retract,
                            max_running_requests=self.max_running_requests, model=self.model,
                            tiny=_tiny_config(self.tiny), speculative=_spec_config(self.speculative))


def _spec_config(fields: dict[str, Any] | None) -> SpecConfig | None:
    try:
        return None if fields is None else SpecConfig(**fields)
    except TypeError as exc:  # an unknown field name
        raise ConfigError(f"speculative: {exc}") from None


def _tiny_config(fields: dict[str, Any]) -> TinyConfig:
    try:
        return TinyConfig(**fields)
    except TypeError as exc:  # an unknown field name
        raise ConfigError(f"tiny: {exc}") from None


class WorkloadSpec(_Strict):
    """A seeded trace: shared system prompts + random suffixes, byte-token vocabulary."""

    requests: int = 64
    system_prompts: int = 4
    system_prompt_len: int = 32
    suffix: tuple[int, int] = (8, 128)
    gen: tuple[int, int] = (4, 32)
    arrivals_per_step: int | None = None  # None: every request at step 0


class Spec(_Strict):
    """One scenario: an engine, a workload, the seed, and what must have happened."""

    version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    description: str = ""
    seed: int = 0
    engine: EngineSpec = EngineSpec()
    workload: WorkloadSpec = WorkloadSpec()
    expect: dict[str, int] = {}  # scheduler counter -> minimum ("sometimes" goals)
    path: str = Field(default="", exclude=True)


class SpecError(ValueError):
    """A spec that cannot run; one `path:line: reason` line per problem."""


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (values parsed as YAML scalars: 4, true, radix) → engine overrides."""
    result: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"--set {item!r}: expected KEY=VALUE")
        result[key.strip()] = yaml.safe_load(value)
    return result


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None) -> Spec:
    """Load one spec file, optionally overriding engine fields (the matrix does)."""
    path = Path(path)
    try:
        raw = read_yaml(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: YAML error: {exc}") from None
    data = dict(raw or {})
    if overrides:
        data["engine"] = {**dict(data.get("engine") or {}), **overrides}
    try:
        spec = Spec.model_validate({**data, "path": str(path)})
    except ValidationError as exc:
        lines = [f"{path}:{locate(raw, err['loc'])}: {'.'.join(map(str, err['loc']))}: {err['msg']}"
                 for err in exc.errors()]
        raise SpecError("\n".join(lines)) from None
    try:
        spec.engine.engine_config(spec.seed)
    except ConfigError as exc:
        raise SpecError(f"{path}:{locate(raw, ('engine',))}: engine: {exc}") from None
    return spec
