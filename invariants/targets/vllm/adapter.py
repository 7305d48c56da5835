"""The vllm target's adapter (the ``Adapter`` of targets/registry.py): vLLM v1's real
``Scheduler`` (or, with kvspec's overlap, its ``AsyncScheduler``), ``KVCacheManager`` and
``BlockPool`` in the vllm venv, driven by kvspec's op traces with only the model runner's
output faked.

Keeps: a spec feature vLLM's scheduler has no counterpart for (sessions, the tiny model,
forced retracts, a KV-cache layout vLLM refuses) makes the run unsupported with the
reason, never a silent pass. The interpreter is, in order: the explicit one,
``$KVSPEC_VLLM_PYTHON``, the release's venv (``--target-version V``: ``.vllm-venv-V``;
0.33.0: ``.vllm-venv``). A seed the explorer draws keeps one whole request beside the token
budget (the context limit is set from it), so it cannot stall on a request that can never
fit — a finding about the draw, not about vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engine.mem import paging
from engine.view import StateView
from invariants.explore.swarm import NEW_MAX, Swarm, sample_prompts, sample_weights
from invariants.scenarios.ops import CloseSession, OpenSession, Trace
from invariants.scenarios.spec import EngineSpec, KVConnectorSpec, KVGroupsSpec
from invariants.targets.drive import Drive
from invariants.targets.driver import LineDriver, TargetUnavailable
from invariants.targets.registry import TargetOptions, stamped_releases
from invariants.targets.vllm.blocks import state_view
from invariants.targets.vllm.pool import PoolMirror

ROOT = Path(__file__).resolve().parents[3]
DRIVER = Path(__file__).resolve().parent / "driver" / "main.py"
ENV_VAR = "KVSPEC_VLLM_PYTHON"
VLLM_VERSION = "0.33.0"  # the release the driver follows (ci/vllm_env.sh)
UNSUPPORTED_OPS = {"force_retract": "force_retract: vLLM preempts under pressure only"}
# no vLLM counterpart: sessions, the forced retract, the session clock
NOT_DRIVEN = (
    "turn",
    "open_session",
    "close_session",
    "wait_turn",
    "force_retract",
    "advance_clock",
)


def vllm_python(explicit: str | Path | None = None, version: str | None = None) -> Path:
    """The interpreter of the vllm venv (see the module docstring for the order); a
    ``version`` other than the default one: its own venv, ``.vllm-venv-VERSION``."""
    if explicit or os.environ.get(ENV_VAR):
        return Path(explicit or os.environ[ENV_VAR])
    venv = ".vllm-venv" if version in (None, VLLM_VERSION) else f".vllm-venv-{version}"
    return ROOT / venv / "bin" / "python"


def installed_releases() -> list[str]:
    """The releases whose venv was built here (its stamp names the release), oldest first."""
    return stamped_releases(ROOT, "vllm")


def open_driver(options: TargetOptions) -> LineDriver:
    python = vllm_python(options.python, options.version)
    if not python.exists():
        release = options.version or VLLM_VERSION
        raise TargetUnavailable(
            f"no vllm interpreter at {python}: run `make vllm-env VLLM_VERSION={release}`, or "
            f"point --target-python / ${ENV_VAR} at a python with vllm {release}"
        )
    return LineDriver("vllm", python, DRIVER)


def unsupported(trace: Trace, version: str | None = None) -> list[str]:
    """Why ``trace`` cannot run on vLLM's scheduler (empty: it can)."""
    e: EngineSpec = trace.engine
    checks = {
        "sessions (vLLM has no session API here)": any(
            isinstance(op, OpenSession | CloseSession) or getattr(op, "session", None)
            for op in trace.ops
        ),
        "model: tiny": e.model != "sim",
        "test_retract": e.test_retract,
        **groups_unsupported(e),
    }
    ops = sorted({UNSUPPORTED_OPS[op.op] for op in trace.ops if op.op in UNSUPPORTED_OPS})
    return [name for name, on in checks.items() if on] + ops


CHUNKED_EAGLE = "kv_groups.chunked_local with speculative (vLLM: no EAGLE with chunked-local)"
CHUNKED_UNEVEN = "kv_groups.chunked_local beside groups of another block size (vLLM refuses it)"
LONE_BLOCK_SIZE = "kv_groups.local_block_size without a sliding window (swa_tokens)"


def groups_unsupported(e: EngineSpec) -> dict[str, bool]:
    """The KV-cache layouts vLLM refuses (its asserts in ChunkedLocalAttentionManager), or
    that say nothing (a local block size with no sliding-window group)."""
    layout = e.kv_groups or KVGroupsSpec()
    chunked = bool(layout.chunked_local)
    uneven = layout.local_block_size not in (None, e.page_size)
    return {
        CHUNKED_EAGLE: chunked and e.speculative is not None,
        CHUNKED_UNEVEN: chunked and uneven and bool(e.swa_tokens),
        LONE_BLOCK_SIZE: bool(layout.local_block_size) and not e.swa_tokens,
    }


def pool_tokens(e: EngineSpec) -> int:
    """vLLM pools every group's blocks: kvspec's full pool per full group, each local
    group's (a sliding window's or chunked-local one's: kvspec's SWA pool, else as large as
    the full one) and each Mamba group's (a full pool's worth of states)."""
    layout = e.kv_groups or KVGroupsSpec()
    local = e.swa_tokens or e.max_total_tokens
    local_specs = (1 if e.swa_tokens else 0) + (1 if layout.chunked_local else 0)
    tokens = e.max_total_tokens * layout.full_copies + local_specs * layout.copies * local
    return tokens + (e.max_total_tokens * layout.copies if e.mamba_group else 0)


def config(trace: Trace, fault: dict[str, Any] | None, observe: bool = True) -> dict[str, Any]:
    """The driver's config op: kvspec's pool of ``max_total_tokens`` as blocks of the page
    size (plus vLLM's null block), its batch limits, prefix caching for the radix cache (the
    chunk cache: none). A hybrid SWA spec becomes a full and a sliding-window KV-cache group
    over one block pool (``pool_tokens``); ``kv_groups`` adds MLA, chunked-local and shared
    specs; overlap is async scheduling; EAGLE is vLLM's EAGLE with as many drafts; a KV
    connector is the driver's seeded one."""
    engine = trace.engine
    tokens = pool_tokens(engine)
    drafts = (engine.speculative or {}).get("num_steps", 3) if engine.speculative else 0
    return {
        "op": "config",
        "block_size": engine.page_size,
        "num_blocks": tokens // engine.page_size + 1,
        "sliding_window": engine.sliding_window if engine.swa_tokens else None,
        "async_scheduling": engine.enable_overlap,  # kvspec's overlap = vLLM's async scheduling
        "num_speculative_tokens": drafts,  # EAGLE's top-1 chain: as many lookahead slots
        "accept_prob": (engine.speculative or {}).get("accept_prob", 0.7),
        "eos_prob": engine.eos_prob,  # the runner samples EOS this often (seeded)
        "max_num_seqs": engine.max_running_requests or engine.max_num_reqs,
        "max_num_batched_tokens": engine.chunked_prefill_size or 8192,
        "max_model_len": engine.context_len,
        "prefix_caching": engine.cache == "radix",
        "connector": engine.kv_connector.model_dump() if engine.kv_connector else None,
        "mamba_group": engine.mamba_group,  # align mode under prefix caching, else none
        "kv_groups": engine.kv_groups.model_dump() if engine.kv_groups else None,
        "fault": fault,
        "views": observe,
    }


def decoder() -> Callable[[dict[str, Any]], StateView]:
    """The driver sends what it read of the pool, as what changed: one run's pool is rebuilt
    and derived here (pool.py: its block records and census input), one per run."""
    pool = PoolMirror()
    return lambda raw: state_view(pool.view(raw))


def notes(trace: Trace, drive: Drive) -> tuple[str, ...]:
    """Which scheduler ran, how often it preempted, the drafts it accepted, the KV-cache
    groups it laid out (more than one), what a fault hit."""
    details = drive.details
    if not details:
        return ()
    found = [f"scheduler: {details['scheduler']}", f"preemptions: {drive.stats.preempted}"]
    if details.get("drafts"):
        found.append("drafts accepted: {} of {} verified".format(*details["drafts"]))
    if details.get("connector"):
        found.append("connector: " + ", ".join(f"{k} {v}" for k, v in details["connector"].items()))
        found.append(f"block owners: {', '.join(details['owners'])}")
    if len(details.get("groups") or ()) > 2:  # more than one group and the scheduler's size
        found.append(f"kv groups: {', '.join(details['groups'])}")
    if details.get("fault"):
        found.append(f"fault fired on blocks {details['fault_fired']}")
    return tuple(found)


def engine(rng: np.random.Generator, extra: np.random.Generator) -> EngineSpec:
    """A configuration the vllm target runs: a small pool under pressure (preemption), any
    block size, a token budget that chunks long prompts, prefix caching (off in some), EOS
    drawn in half; a third add a sliding-window KV-cache group beside the full one; half
    schedule asynchronously (kvspec's overlap), a third of either kind verify EAGLE drafts;
    a third run a KV connector, a quarter add a Mamba group (``extra``: the later draws, so
    earlier seeds keep theirs)."""
    ps = int(rng.choice([1, 4, 16, 16]))
    tokens = max(paging.ceil_align(int(rng.integers(256, 1024)), ps), 16 * ps)
    swa, overlap = rng.random() < 1 / 3, bool(rng.random() < 0.5)
    drafts = int(rng.integers(1, 5)) if not overlap and rng.random() < 1 / 3 else 0
    if overlap and extra.random() < 1 / 3:
        drafts = int(extra.integers(1, 5))
    speculative = {
        "version": 2 if overlap else 1,  # kvspec's EAGLE under overlap is its v2
        "num_steps": drafts,
        "num_draft_tokens": drafts + 1,
        "accept_prob": round(float(rng.uniform(0.3, 0.9)), 2),
    }
    return EngineSpec(
        swa_tokens=tokens if swa else None,
        sliding_window=int(rng.choice([8, 16, 32, 64])) if swa else None,
        speculative=speculative if drafts else None,
        page_size=ps,
        max_total_tokens=tokens,
        max_num_reqs=int(rng.integers(2, 12)),
        context_len=min(tokens - NEW_MAX - 2 * ps - 16, 512),
        chunked_prefill_size=max(int(rng.choice([16, 32, 64, 128, 256])), ps),
        enable_overlap=overlap,
        eos_prob=float(rng.choice([0.0, 0.0, 0.02, 0.05])),
        cache="chunk" if rng.random() < 0.15 else "radix",  # chunk: no prefix caching
        kv_connector=connector(extra) if extra.random() < 1 / 3 else None,
        mamba_group=bool(extra.random() < 1 / 4),
    )


def connector(rng: np.random.Generator) -> KVConnectorSpec:
    """A seeded connector: a consumer, a producer or both, at drawn rates."""
    rates = {k: round(float(rng.uniform(0.05, 0.8)), 2) for k in CONNECTOR_RATES}
    return KVConnectorSpec(
        role=str(rng.choice(["kv_consumer", "kv_producer", "kv_both"])),
        seed=int(rng.integers(0, 2**31)),
        max_delay=int(rng.integers(1, 5)),
        **rates,
    )


def groups(rng: np.random.Generator, e: EngineSpec) -> KVGroupsSpec | None:
    """A third of the seeds lay out more KV-cache groups: MLA's spec for the full group in
    half of those, a chunked-local group in a third (never with drafts: vLLM refuses it),
    one to three groups per local spec (two full-attention groups in a third), and sliding-
    window groups of twice the block size in a third of those with a window (neither beside
    a chunked-local nor a Mamba group)."""
    if rng.random() >= 1 / 3:
        return None
    chunked = int(rng.choice([16, 32, 64])) if rng.random() < 1 / 3 else None
    chunked = chunked if e.speculative is None else None
    uneven = rng.random() < 1 / 3 and e.swa_tokens and not chunked and not e.mamba_group
    return KVGroupsSpec(
        attention="mla" if rng.random() < 0.5 else "full",
        chunked_local=chunked,
        copies=int(rng.integers(1, 4)),
        full_copies=int(rng.choice([1, 1, 2])),
        local_block_size=2 * e.page_size if uneven else None,
    )


CONNECTOR_RATES = tuple(f for f in KVConnectorSpec.model_fields if f.endswith("_prob"))


def swarm(seed: int) -> Swarm:
    """The configuration and op mix of ``seed`` on vLLM (no session or retract op); with EOS
    drawn, a third of the requests honour it (the penalized ones: a minimum length too)."""
    drawn = engine(np.random.default_rng([seed, 20]), np.random.default_rng([seed, 23]))
    layout = groups(np.random.default_rng([seed, 24]), drawn)
    drawn = drawn.model_copy(update={"kv_groups": layout})
    weights = sample_weights(np.random.default_rng([seed, 21]))
    weights = {k: (0.0 if k in NOT_DRIVEN else w) for k, w in weights.items()}
    prompts = sample_prompts(np.random.default_rng([seed, 22]), drawn)
    return Swarm(drawn, weights, prompts, 0.0, 1 / 3 if drawn.eos_prob else 0.0)


def label(swarm: Swarm) -> str:
    """A seed's configuration on one line."""
    e = swarm.engine
    ops = [k for k, w in swarm.weights.items() if w > 0 and k not in ("submit", "step")]
    window = f" window{e.sliding_window}" if e.swa_tokens else ""
    drafts = f" drafts{e.speculative['num_steps']}" if e.speculative else ""
    mode = "async" if e.enable_overlap else "sync"
    kv = e.kv_connector
    xfer = f" {kv.role}(seed{kv.seed})" if kv else ""
    xfer += " mamba" if e.mamba_group else ""
    xfer += _groups_label(e.kv_groups) if e.kv_groups else ""
    return (
        f"block{e.page_size} pool{e.max_total_tokens}{window} budget{e.chunked_prefill_size} "
        f"seqs{e.max_num_reqs} {mode}{drafts}{xfer}{'' if e.cache == 'radix' else ' nocache'} "
        f"eos{e.eos_prob} ops[{','.join(ops)}]"
    )


def _groups_label(layout: KVGroupsSpec) -> str:
    parts = [" mla" if layout.attention == "mla" else ""]
    parts.append(f" chunk{layout.chunked_local}" if layout.chunked_local else "")
    parts.append(f" x{layout.copies}" if layout.copies > 1 else "")
    parts.append(f" full-x{layout.full_copies}" if layout.full_copies > 1 else "")
    parts.append(f" local-block{layout.local_block_size}" if layout.local_block_size else "")
    return "".join(parts)
