"""The sglang-scheduler target's adapter (the ``Adapter`` of targets/registry.py): SGLang's REAL
``Scheduler`` and event loop (normal and overlap) on CPU, one release per venv, with only the
model forward faked (``driver/worker.py``) — the real PrefillAdder, chunked prefill, mixed
chunk, retract (SGLang's own ``SGLANG_TEST_RETRACT`` hook), ``process_batch_result``, the
session controller and streaming sessions.

Keeps: a step is one iteration of SGLang's own event loop, whatever it decides to run; a
retract is SGLang's own test hook (``test_retract`` every ``test_retract_interval`` forwards),
never an op; output tokens are the fake worker's seeded draws (``driver/worker.token_at``), EOS
included; time is the driver's simulated clock (kvspec's tick per iteration, plus
``advance_clock``). What a trace may use beyond the plain features depends on the release: the
``supports`` its driver's banner lists (the probes' answers: the code it finds, never its
version), so a trace the release's driver does not drive is refused before it runs — before
any driver starts once one has answered for the release, else right after it starts. A
``speculative`` section runs as SGLang's EAGLE flags (topk 1) with the fake draft worker's
seeded accept lengths; a release whose only EAGLE worker is spec v2 runs a v1 spec (overlap
off) on its synchronous spec-v2 path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.config.speculative import SpecConfig
from engine.mem import paging
from engine.view import StateView
from invariants.explore.swarm import FEATURES, NEW_MAX, Swarm, sample_prompts, sample_weights
from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import EngineSpec, vllm_only_fields
from invariants.targets.census_mirror import CensusMirror
from invariants.targets.drive import Drive
from invariants.targets.driver import LineDriver
from invariants.targets.registry import TargetOptions
from invariants.targets.sglang_scheduler.releases import (
    DEFAULT_VERSION,
    SUPPORTS_SEEN,
    SchedulerDriver,
    installed_versions,
)

EOS_ID = 257  # the driver's model config (driver/model/config.json) and kvspec's tokenizer
UNSUPPORTED_OPS = {
    "force_retract": "force_retract: the real scheduler retracts through its own test hook "
    "(engine: test_retract, test_retract_interval), not on demand",
}


def open_driver(options: TargetOptions) -> LineDriver:
    return SchedulerDriver(options.version, options.python)


def installed_releases() -> list[str]:
    """The releases whose venv is built here, oldest first."""
    return installed_versions()


def release_supports(version: str | None = None) -> frozenset[str] | None:
    """The engine features beyond the plain ones the release's driver said it drives (its
    banner's ``supports``); None while no driver has answered for the release."""
    return SUPPORTS_SEEN.get(version or DEFAULT_VERSION)


def unsupported_engine(engine: EngineSpec, version: str | None = None) -> list[str]:
    """Engine features of a spec the release's real-scheduler driver does not drive (yet); a
    feature only the release's driver can answer for is not refused until it has."""
    release = version or DEFAULT_VERSION
    supports = release_supports(release)
    mla = is_mla(engine)
    checks = {
        f"speculative (EAGLE: sglang {release}'s adapter drives no draft worker here)": (
            engine.speculative is not None
            and supports is not None
            and "speculative" not in supports
        ),
        "speculative on hybrid SWA or MLA pools (the adapters drive no draft worker there)": (
            engine.speculative is not None and (engine.swa_tokens is not None or mla)
        ),
        f"swa_tokens (sglang {release}: the driver finds no pool builder for hybrid SWA)": (
            engine.swa_tokens is not None and supports is not None and "swa" not in supports
        ),
        f"tiny.attention=mla (sglang {release}: the driver finds no pool builder for MLA)": (
            mla and supports is not None and "mla" not in supports
        ),
        "model: tiny (the target's forward is the fake worker)": engine.model != "sim" and not mla,
    }
    vllm_only = [
        f"{name} (a vLLM feature: the vllm target only)" for name in vllm_only_fields(engine)
    ]
    return [name for name, on in checks.items() if on] + vllm_only


def is_mla(engine: EngineSpec) -> bool:
    """The spec asks for MLA (``model: tiny`` with ``tiny.attention: mla``): it runs on the
    release's own MLATokenToKVPool (a tiny DeepSeek-V3 config; the forward stays the fake
    worker's, as for every spec here), never on an MHA pool."""
    return engine.model == "tiny" and engine.tiny.get("attention") == "mla"


def unsupported(trace: Trace, version: str | None = None) -> list[str]:
    """Why ``trace`` cannot run on the release's real scheduler (empty: it can)."""
    ops = sorted({UNSUPPORTED_OPS[op.op] for op in trace.ops if op.op in UNSUPPORTED_OPS})
    return unsupported_engine(trace.engine, version) + ops


def config(trace: Trace, fault: dict[str, Any] | None = None, observe: bool = True) -> dict:
    """The driver's config op: SGLang's server arguments for the trace's engine section
    (``observe`` False: the driver only steps, reading no view and no check of SGLang's)."""
    engine, seed = trace.engine, trace.seed
    built = engine.engine_config(seed)
    return {
        "op": "config",
        "page_size": engine.page_size,
        "pool_tokens": engine.max_total_tokens,
        "max_reqs": engine.max_num_reqs,
        "max_context": engine.context_len,
        "max_running_requests": built.running_limit,
        "chunked_prefill_size": engine.chunked_prefill_size,
        "max_prefill_tokens": built.max_prefill_tokens,
        "overlap": engine.enable_overlap,
        "mixed_chunk": engine.enable_mixed_chunk,
        "cache": engine.cache,
        "streaming_sessions": engine.enable_streaming_session,
        "retract_interval": engine.test_retract_interval if engine.test_retract else 0,
        "seed": seed,
        "eos_prob": engine.eos_prob,
        "eos_id": EOS_ID,
        "speculative": _speculative(built.speculative),
        "observe": observe,
        **_hybrid(engine),
    }


def _hybrid(engine: EngineSpec) -> dict[str, Any]:
    """The config op's hybrid sections: ``swa`` (the SWA layer's window and the SWA pool's
    tokens) and ``mla``; none for a plain engine, whose op stays as it was."""
    found: dict[str, Any] = {}
    if engine.swa_tokens is not None:
        found["swa"] = {"window": engine.sliding_window, "tokens": engine.swa_tokens}
    if is_mla(engine):
        found["mla"] = True
    return found


def _speculative(spec: SpecConfig | None) -> dict[str, Any] | None:
    """The EAGLE section of the config op (None: no speculative decoding)."""
    if spec is None:
        return None
    return {
        "num_steps": spec.num_steps,
        "num_draft_tokens": spec.num_draft_tokens,
        "accept_prob": spec.accept_prob,
    }


def decoder() -> Callable[[dict[str, Any]], StateView]:
    """One run's views: the census inputs come as deltas (census_mirror.py)."""
    return CensusMirror().view


def notes(trace: Trace, drive: Drive) -> tuple[str, ...]:
    """Nothing beyond what every target says (the disagreements, the waivers)."""
    return ()


def engine(rng: np.random.Generator) -> EngineSpec:
    """A configuration the real scheduler runs: small pools under pressure, any page size and
    chunk the server accepts, SGLang's test retract at an interval, or not."""
    ps = int(rng.choice([1, 1, 4, 4, 16]))
    tokens = max(paging.ceil_align(int(rng.integers(256, 1024)), ps), 16 * ps)
    chunk = None if rng.random() < 0.15 else int(rng.choice([16, 32, 64, 128]))
    streaming = bool(rng.random() < 0.6)
    return EngineSpec(
        page_size=ps,
        max_total_tokens=tokens,
        max_num_reqs=int(rng.integers(3, 12)),
        context_len=min(tokens - NEW_MAX - 2 * ps - 16, 512),
        cache="radix" if streaming or rng.random() < 0.9 else "chunk",
        chunked_prefill_size=None if chunk is None else max(chunk, ps),
        enable_overlap=bool(rng.random() < 0.5),
        enable_mixed_chunk=chunk is not None and bool(rng.random() < 0.25),
        enable_streaming_session=streaming,
        test_retract=bool(rng.random() < 0.5),
        test_retract_interval=int(rng.integers(1, 7)),
        eos_prob=float(rng.choice([0.0, 0.0, 0.02, 0.05])),
    )


def swarm(seed: int) -> Swarm:
    """The configuration and op mix of ``seed`` on the real scheduler (retracts come from
    the test hook, so the on-demand ``force_retract`` op is never drawn)."""
    drawn = engine(np.random.default_rng([seed, 10]))
    weights = {**sample_weights(np.random.default_rng([seed, 11])), "force_retract": 0.0}
    if not drawn.enable_streaming_session and np.random.default_rng([seed, 12]).random() < 0.5:
        weights = {k: (0.0 if k in FEATURES["sessions"] else w) for k, w in weights.items()}
    prompts = sample_prompts(np.random.default_rng([seed, 13]), drawn)
    return Swarm(drawn, weights, prompts, 0.8 if drawn.enable_streaming_session else 0.0)


def label(swarm: Swarm) -> str:
    """A seed's configuration on one line."""
    e = swarm.engine

    def sign(on: object) -> str:
        return "+" if on else "-"

    ops = [k for k, w in swarm.weights.items() if w > 0 and k not in ("submit", "step")]
    return (
        f"ps{e.page_size} {e.cache} pool{e.max_total_tokens} chunk{e.chunked_prefill_size or '-'} "
        f"overlap{sign(e.enable_overlap)} mixed{sign(e.enable_mixed_chunk)} "
        f"retract{e.test_retract_interval if e.test_retract else '-'} "
        f"streaming{sign(e.enable_streaming_session)} ops[{','.join(ops)}]"
    )
