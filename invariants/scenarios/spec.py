"""Scenario specs: YAML files under specs/ → validated Spec objects, errors with file:line.

Keeps: a spec that loads is runnable — unknown keys, bad types and values the engine's own
config rejects are reported as `path:line: reason` before anything runs.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.config import EngineConfig, MemoryConfig
from engine.config.model import TinyConfig
from engine.config.speculative import SpecConfig
from engine.errors import ConfigError
from invariants.checking.loader import LineDict, locate, read_yaml, shipped_catalog
from invariants.scenarios.matrix_axes import AXIS_NAMES, apply_axes, load_matrix
from invariants.scenarios.scenario_schema import ORACLES, OracleName, WorkloadSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Rate = float  # a probability, validated by Field(ge=0, le=1)


class KVConnectorSpec(_Strict):
    """vLLM's KV-connector API on (the vllm target only), driven by its seeded connector
    (invariants/targets/vllm/driver/connector.py): a consumer matches external tokens and
    loads them (async loads, deferred lookups, load failures), a producer sends a finished
    request's blocks before they are freed; ``kv_both`` does both. Every choice is a coin of
    ``seed``; a transfer takes 1 to ``max_delay`` steps."""

    role: Literal["kv_consumer", "kv_producer", "kv_both"] = "kv_consumer"
    seed: int = 0
    hit_prob: Rate = Field(0.5, ge=0, le=1)  # a lookup matches external tokens
    async_prob: Rate = Field(0.5, ge=0, le=1)  # a match loads asynchronously
    fail_prob: Rate = Field(0.1, ge=0, le=1)  # a load fails (its tokens are recomputed)
    defer_prob: Rate = Field(0.2, ge=0, le=1)  # a lookup answers "not yet" once or twice
    send_prob: Rate = Field(0.5, ge=0, le=1)  # a finished request's blocks are sent first
    max_delay: int = Field(3, ge=1, le=16)


class KVGroupsSpec(_Strict):
    """vLLM's KV-cache groups beyond one full-attention and one sliding-window group (the vllm
    target only): ``attention`` the full group's spec (``mla``: vLLM's MLAAttentionSpec, one
    latent per token); ``chunked_local`` a chunked-local attention group of that chunk size
    (Llama 4's ``attention_chunk_size``); ``copies`` how many groups share each local spec
    (sliding window, chunked-local, Mamba), as vLLM splits a hybrid model's layers into groups
    of equal size, and ``full_copies`` how many full-attention groups (a model with more full
    layers than of another kind; with no local spec every group shares one spec, vllm#51888);
    ``local_block_size`` the sliding-window groups' block size (vLLM scales a group's block
    size to equalize page sizes: groups of different block sizes; the scheduler then aligns
    to their least common multiple)."""

    attention: Literal["full", "mla"] = "full"
    chunked_local: int | None = Field(None, ge=1)
    copies: int = Field(1, ge=1, le=4)
    full_copies: int = Field(1, ge=1, le=4)
    local_block_size: int | None = Field(None, ge=1)


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
    enable_streaming_session: bool = False  # --enable-streaming-session
    session_radix_cache: bool = False  # --enable-session-radix-cache
    test_retract: bool = False
    test_retract_interval: int = 3  # SGLANG_TEST_RETRACT_INTERVAL
    max_running_requests: int | None = None
    eos_prob: float = 0.0
    model: Literal["sim", "tiny"] = "sim"
    tiny: dict[str, Any] = {}  # TinyConfig fields (engine/config/model.py)
    speculative: dict[str, Any] | None = None  # SpecConfig fields (engine/config/speculative.py)
    kv_connector: KVConnectorSpec | None = None  # vLLM's KV connectors (the vllm target only)
    mamba_group: bool = False  # a Mamba (state) KV-cache group beside attention (vllm only)
    kv_groups: KVGroupsSpec | None = None  # MLA, chunked-local, shared specs (vllm only)

    def engine_config(self, seed: int) -> EngineConfig:
        memory = MemoryConfig(
            page_size=self.page_size,
            max_total_tokens=self.max_total_tokens,
            max_num_reqs=self.max_num_reqs,
            context_len=self.context_len,
            cache=self.cache,
            swa_tokens=self.swa_tokens,
            sliding_window=self.sliding_window,
            session_radix_cache=self.session_radix_cache,
        )
        return EngineConfig(
            memory=memory,
            seed=seed,
            eos_prob=self.eos_prob,
            chunked_prefill_size=self.chunked_prefill_size,
            enable_overlap=self.enable_overlap,
            enable_mixed_chunk=self.enable_mixed_chunk,
            test_retract=self.test_retract,
            test_retract_interval=self.test_retract_interval,
            enable_streaming_session=self.enable_streaming_session,
            max_running_requests=self.max_running_requests,
            model=self.model,
            tiny=_tiny_config(self.tiny),
            speculative=_spec_config(self.speculative),
        )


# fields the vllm target's swarm draws, no other
VLLM_ONLY = ("kv_connector", "mamba_group", "kv_groups")


def vllm_only_fields(engine: EngineSpec) -> list[str]:
    """The engine fields set that only the vllm target runs (kvspec's engine and SGLang's
    refuse them, naming the field)."""
    return [name for name in VLLM_ONLY if getattr(engine, name) not in (None, False)]


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


MatrixAxes = dict[str, list[Any] | Literal["all"]]


class Spec(_Strict):
    """One scenario: an engine, a workload, the seed, the invariants it is checked against,
    the matrix axes it runs over, the response oracles, and what must have happened."""

    version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    description: str = ""
    seed: int = 0
    engine: EngineSpec = EngineSpec()
    workload: WorkloadSpec = WorkloadSpec()
    invariants: list[str] = ["*"]  # catalog ids or fnmatch globs (session.*)
    matrix: MatrixAxes = {}  # axis -> values (or "all") this spec runs over (ci/matrix.yaml)
    oracles: list[OracleName] = list(ORACLES)  # response oracles (scenario_oracles.py)
    expect: dict[str, int] = {}  # scheduler counter -> minimum ("sometimes" goals)
    path: str = Field(default="", exclude=True)

    def selects(self, invariant_id: str) -> bool:
        return any(fnmatch.fnmatchcase(invariant_id, pattern) for pattern in self.invariants)


class SpecError(ValueError):
    """A spec that cannot run; one `path:line: reason` line per problem."""


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (values parsed as YAML scalars: 4, true, on, radix) → overrides of
    engine fields or matrix axes (``attention=mla``, ``speculative=eagle_v2``)."""
    result: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"--set {item!r}: expected KEY=VALUE")
        result[key.strip()] = yaml.safe_load(value)
    return result


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None) -> Spec:
    """Load one spec file, optionally overriding engine fields or matrix axes (the matrix
    does); every problem is reported as ``path:line: field: reason``."""
    path = Path(path)
    try:
        raw = read_yaml(path.read_text())
    except OSError as exc:
        raise SpecError(
            f"{path}: cannot read the spec ({exc.strerror}); specs live in specs/"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"{mark.line + 1}:" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{path}:{line} YAML error: {what}") from None
    data = dict(raw or {})
    if overrides:
        data["engine"] = _overridden(path, dict(data.get("engine") or {}), overrides)
    try:
        spec = Spec.model_validate({**data, "path": str(path)})
    except ValidationError as exc:
        lines = [
            f"{path}:{locate(raw, err['loc'])}: {'.'.join(map(str, err['loc']))}: {err['msg']}"
            for err in exc.errors()
        ]
        raise SpecError("\n".join(lines)) from None
    try:
        spec.engine.engine_config(spec.seed)
    except ConfigError as exc:
        raise SpecError(f"{path}:{locate(raw, ('engine',))}: engine: {exc}") from None
    problems = _semantic_errors(spec, raw if isinstance(raw, LineDict) else LineDict(1))
    if problems:
        raise SpecError("\n".join(f"{path}:{line}: {what}" for line, what in problems))
    return spec


def _overridden(path: Path, engine: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Engine fields with ``overrides`` applied: axis names through the matrix's meaning,
    anything else as an engine field."""
    axes = {k: v for k, v in overrides.items() if k in AXIS_NAMES}
    known = load_matrix().axes
    for axis, value in axes.items():
        if value not in known[axis]:
            raise SpecError(
                f"{path}: --set {axis}={value}: not a value of the axis (values: {known[axis]})"
            )
    fields = {
        **EngineSpec().model_dump(),
        **engine,
        **{k: v for k, v in overrides.items() if k not in axes},
    }
    return apply_axes(fields, axes)


def _semantic_errors(spec: Spec, raw: LineDict) -> list[tuple[int, str]]:
    """What the schema cannot see: unknown invariant ids, unknown matrix axes and values,
    sessions the engine cannot open, faults without what they need."""
    problems = []
    ids = shipped_catalog().ids
    for i, pattern in enumerate(spec.invariants):
        if not fnmatch.filter(ids, pattern):
            problems.append(
                (
                    locate(raw, ("invariants", i)),
                    f"invariants.{i}: {pattern!r} matches no invariant",
                )
            )
    known = load_matrix().axes
    for axis, values in spec.matrix.items():
        line = locate(raw, ("matrix", axis))
        if axis not in known:
            problems.append((line, f"matrix.{axis}: unknown axis (axes: {', '.join(known)})"))
        elif values != "all" and (bad := [v for v in values if v not in known[axis]]):
            problems.append((line, f"matrix.{axis}: {bad} not among the axis values {known[axis]}"))
    sessions, faults = spec.workload.sessions, spec.workload.faults
    if sessions.streaming and not spec.engine.enable_streaming_session:
        problems.append(
            (
                locate(raw, ("workload", "sessions", "streaming")),
                "workload.sessions.streaming: needs engine.enable_streaming_session: true",
            )
        )
    if faults.timeout and sessions.timeout is None:
        problems.append(
            (
                locate(raw, ("workload", "faults", "timeout")),
                "workload.faults.timeout: needs workload.sessions.timeout",
            )
        )
    return problems
