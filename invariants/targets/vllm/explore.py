"""Seed-driven exploration of vLLM v1's real scheduler (`kvspec explore --target vllm`): each
seed draws a configuration the vllm target runs (block size, pool size, token budget, batch
limit) and an op mix of plain traffic (aborts in each phase, cache flushes); the loop, the
failure keys and the shrinking are the real-engine explorer's (invariants/explore/real.py).

Keeps: a seed's result depends on the seed, the step budget and the release only; each
worker process keeps one driver (vLLM imported once) and every trace starts with the config
op, which builds a fresh Scheduler. The pool always holds one whole request beside the token
budget (the context limit is set from it), so a seed cannot stall on a request that can never
fit — a finding about the draw, not about vLLM.
"""

from __future__ import annotations

import numpy as np

from engine.mem import paging
from invariants.checking.loader import shipped_catalog
from invariants.explore.real import RealTarget
from invariants.explore.swarm import NEW_MAX, Swarm, sample_prompts, sample_weights
from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import EngineSpec
from invariants.targets.sglang.run import SGLangOutcome
from invariants.targets.vllm.run import run_trace_on_vllm
from invariants.targets.vllm.target import VLLMDriver

DEFAULT_SEEDS, DEFAULT_STEPS = 40, 200
# no vLLM counterpart (run.py): sessions, the forced retract, the session clock
NOT_DRIVEN = (
    "turn",
    "open_session",
    "close_session",
    "wait_turn",
    "force_retract",
    "advance_clock",
)
_DRIVERS: dict[str | None, VLLMDriver] = {}  # per worker process


def vllm_engine(rng: np.random.Generator) -> EngineSpec:
    """A configuration the vllm target runs: a small pool under pressure (preemption), any
    block size, a token budget that chunks long prompts, prefix caching (off in some), EOS
    drawn in half; a third add a sliding-window KV-cache group beside the full one; half
    schedule asynchronously (kvspec's overlap), a third of the others verify EAGLE drafts."""
    ps = int(rng.choice([1, 4, 16, 16]))
    tokens = max(paging.ceil_align(int(rng.integers(256, 1024)), ps), 16 * ps)
    swa, overlap = rng.random() < 1 / 3, bool(rng.random() < 0.5)
    drafts = int(rng.integers(1, 5)) if not overlap and rng.random() < 1 / 3 else 0
    speculative = {"version": 1, "num_steps": drafts, "num_draft_tokens": drafts + 1,
                   "accept_prob": round(float(rng.uniform(0.3, 0.9)), 2)}  # fmt: skip
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
    )


def vllm_swarm(seed: int) -> Swarm:
    """The configuration and op mix of ``seed`` on vLLM (no session or retract op); with EOS
    drawn, a third of the requests honour it (the penalized ones: a minimum length too)."""
    engine = vllm_engine(np.random.default_rng([seed, 20]))
    weights = sample_weights(np.random.default_rng([seed, 21]))
    weights = {k: (0.0 if k in NOT_DRIVEN else w) for k, w in weights.items()}
    prompts = sample_prompts(np.random.default_rng([seed, 22]), engine)
    return Swarm(engine, weights, prompts, 0.0, 1 / 3 if engine.eos_prob else 0.0)


def vllm_label(swarm: Swarm) -> str:
    """A seed's configuration on one line."""
    e = swarm.engine
    ops = [k for k, w in swarm.weights.items() if w > 0 and k not in ("submit", "step")]
    window = f" window{e.sliding_window}" if e.swa_tokens else ""
    drafts = f" drafts{e.speculative['num_steps']}" if e.speculative else ""
    mode = "async" if e.enable_overlap else "sync"
    return (
        f"block{e.page_size} pool{e.max_total_tokens}{window} budget{e.chunked_prefill_size} "
        f"seqs{e.max_num_reqs} {mode}{drafts}{'' if e.cache == 'radix' else ' nocache'} "
        f"eos{e.eos_prob} ops[{','.join(ops)}]"
    )


def driver_for(python: str | None) -> VLLMDriver:
    """This process's driver (started once, reused by every trace)."""
    if python not in _DRIVERS or _DRIVERS[python].proc.poll() is not None:
        _DRIVERS[python] = VLLMDriver(python)
    return _DRIVERS[python]


def check_on_vllm(trace: Trace, version: str | None, python: str | None) -> SGLangOutcome:
    """``trace`` at level 2 on this process's driver (``version``: the release it runs,
    which the interpreter decides: only reported)."""
    return run_trace_on_vllm(trace, shipped_catalog(), 2, driver=driver_for(python))


def vllm_target(python: str | None = None) -> RealTarget:
    """vLLM's real scheduler under ``python`` (default: .vllm-venv)."""
    return RealTarget("vllm", "vLLM", vllm_swarm, vllm_label, check_on_vllm, None, python)
