"""Swarm testing: per seed, an engine configuration and an op mix drawn from the seed.

Keeps: every configuration is one the matrix could run — each axis of ci/matrix.yaml
(page size, attention, speculative, retract, mixed chunk, overlap, cache) takes one of its
listed values, rows breaking a declared constraint are drawn again, and `apply_axes` gives
the axis values their meaning; the pool is then sized small enough that the cache evicts
and decode retracts, yet large enough that any request the engine accepts (context limit)
fits beside the pages the open sessions' slots pin — a request that can never run would
stall every seed, a finding about the configuration, not the engine (TigerBeetle's
`cluster_recoverable` triage). One seed in ``TINY_SHARE`` runs the tiny transformer in
float64 (the token oracle and its KV reads checked as the sim model's), and only those draw
MLA, which means the tiny model; the rest run the sim model (a tiny run costs about twice
as much: torch per forward, the scratch reference per response). The op mix
switches whole features off per seed (no sessions, no aborts, no faults at all) — swarm
testing (Groce et al., TigerBeetle's `options_swarm`): a seed without aborts reaches states an
abort-heavy seed never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.mem import paging
from invariants.scenarios.matrix_axes import apply_axes, load_matrix, violations
from invariants.scenarios.spec import EngineSpec

SIM_SKIPS = {"attention": ("mla",)}  # MLA means the tiny model: see the module docstring
TINY_SHARE = 0.0625  # seeds on the tiny transformer (its own sub-stream: others stay as drawn)
TINY = {"num_layers": 2, "dtype": "float64"}  # float64: the token oracle is exact (decision 13)
# op kind -> base weight; the first two always run, the others a seed may switch off
BASE_WEIGHTS: dict[str, float] = {
    "submit": 3.0,
    "step": 4.0,
    "turn": 2.0,
    "open_session": 0.6,
    "close_session": 0.3,
    "abort": 1.0,
    "force_retract": 0.5,
    "flush_cache": 0.2,
    "advance_clock": 0.3,
    "wait_turn": 0.5,
}
ALWAYS = ("submit", "step")
FEATURES = {
    "sessions": ("turn", "open_session", "close_session", "wait_turn"),
    "abort": ("abort",),
    "retract": ("force_retract",),
    "flush": ("flush_cache",),
    "clock": ("advance_clock",),
}
NEW_MAX = 64  # the most new tokens a request asks for
MIN_CONTEXT = 64  # the shortest context limit a seed runs with
MAX_OPEN_SESSIONS = 3  # idle session slots pin KV: more would starve admission in small pools
CALM_PROB = 0.15  # seeds with no fault ops at all: only traffic
FEATURE_OFF_PROB = 0.3
SESSION_RADIX_PROB = 0.35  # of the seeds whose cache allows session tags (radix, no SWA)
RETRACT_INTERVALS = (1, 2, 3, 5)  # forwards between forced retracts (SGLang's default: 3)
RUNNING_CAP_PROB = 0.25  # seeds with a max_running_requests below their request rows


@dataclass(frozen=True, slots=True)
class PromptShape:
    """How one seed's prompts look: shared heads (radix hits) and length ranges."""

    heads: tuple[tuple[int, ...], ...]
    suffix_max: int
    new_max: int
    input_limit: int  # a prompt this long or longer is rejected at submit (400)


@dataclass(frozen=True, slots=True)
class Swarm:
    """One seed's configuration: the engine, the op weights (0: off), the prompt shape."""

    engine: EngineSpec
    weights: dict[str, float]
    prompts: PromptShape
    streaming_prob: float  # chance that an opened session streams (needs the engine flag)
    penalized: float = 0.0  # chance that a request asks for the penalizers

    @property
    def label(self) -> str:
        on = [k for k, w in self.weights.items() if w > 0 and k not in ALWAYS]
        e = self.engine

        def sign(on: object) -> str:
            return "+" if on else "-"

        return (
            f"ps{e.page_size} {e.cache}{'+tags' if e.session_radix_cache else ''} "
            f"pool{e.max_total_tokens} overlap{sign(e.enable_overlap)} "
            f"swa{sign(e.swa_tokens)} eagle{sign(e.speculative)} ops[{','.join(on)}]"
        )


def sample_axes(rng: np.random.Generator, tiny: bool = False) -> dict[str, Any]:
    """One value per matrix axis (redrawn until no declared constraint is broken); MLA only
    on the tiny model."""
    matrix = load_matrix()
    skips = {} if tiny else SIM_SKIPS
    axes = {
        axis: [v for v in values if v not in skips.get(axis, ())]
        for axis, values in matrix.axes.items()
    }
    while True:
        row = {axis: values[int(rng.integers(len(values)))] for axis, values in axes.items()}
        if not violations(row, matrix):
            return row


def sample_swarm(seed: int) -> Swarm:
    """The configuration of ``seed`` (its own sub-streams: engine, weights, prompts)."""
    tiny = bool(np.random.default_rng([seed, 4]).random() < TINY_SHARE)
    engine = sample_options(
        sample_engine(np.random.default_rng([seed, 0]), tiny), np.random.default_rng([seed, 6])
    )
    weights = sample_weights(np.random.default_rng([seed, 1]))
    if not engine.enable_streaming_session and np.random.default_rng([seed, 2]).random() < 0.5:
        weights = {k: (0.0 if k in FEATURES["sessions"] else w) for k, w in weights.items()}
    return Swarm(
        engine,
        weights,
        sample_prompts(np.random.default_rng([seed, 3]), engine),
        0.8 if engine.enable_streaming_session else 0.0,
        float(np.random.default_rng([seed, 5]).choice([0.0, 0.0, 0.25, 0.5])),
    )


def sample_engine(rng: np.random.Generator, tiny: bool = False) -> EngineSpec:
    """Matrix axis values, then a pool under pressure, a chunk size, a SWA pool and window,
    an EAGLE chain, EOS, streaming sessions — all drawn from ``rng``; the tiny model if
    ``tiny``."""
    row = sample_axes(rng, tiny)
    ps = int(row.get("page_size", 1))
    tokens = max(paging.ceil_align(int(rng.integers(256, 1024)), ps), smallest_pool(ps))
    tiny_model: dict[str, Any] = {"model": "tiny", "tiny": TINY} if tiny else {}
    fields = apply_axes(
        EngineSpec(
            page_size=ps,
            max_total_tokens=tokens,
            max_num_reqs=int(rng.integers(MAX_OPEN_SESSIONS + 2, 12)),  # a row beside the slots
            chunked_prefill_size=None
            if rng.random() < 0.15
            else int(rng.choice([16, 32, 64, 128])),
            sliding_window=int(rng.choice([16, 32, 64])),
            eos_prob=float(rng.choice([0.0, 0.0, 0.02, 0.05])),
            enable_streaming_session=bool(rng.random() < 0.5),
            **tiny_model,
        ).model_dump(),
        row,
    )
    if fields.get("swa_tokens"):  # a SWA pool of its own size, still page-sized
        fields["swa_tokens"] = tokens // int(rng.choice([1, 2]))  # fit_pools aligns, floors
    if fields.get("speculative"):
        steps = int(rng.integers(1, 5))
        fields["speculative"] = {
            **fields["speculative"],
            "num_steps": steps,
            "num_draft_tokens": steps + 1,
            "accept_prob": round(float(rng.uniform(0.3, 0.9)), 2),
        }
    return EngineSpec.model_validate(fit_pools(fields))


def sample_options(engine: EngineSpec, rng: np.random.Generator) -> EngineSpec:
    """The options no matrix axis names, from a draw of their own (a seed's configuration
    drawn before they were is otherwise unchanged): session tags over the radix tree where the
    cache allows them (--enable-session-radix-cache), the forced retract's interval, a running
    request cap from one request up. Every draw is taken whether used or not."""
    radix, interval = rng.random() < SESSION_RADIX_PROB, rng.choice(RETRACT_INTERVALS)
    capped, cap = rng.random() < RUNNING_CAP_PROB, int(rng.integers(1, engine.max_num_reqs + 1))
    fields = engine.model_dump()
    fields["session_radix_cache"] = radix and engine.cache == "radix" and not engine.swa_tokens
    fields["test_retract_interval"] = int(interval) if engine.test_retract else 3
    fields["max_running_requests"] = cap if capped else None
    return EngineSpec.model_validate(fields)


def fit_pools(fields: dict[str, Any]) -> dict[str, Any]:
    """Engine fields made fit for the swarm: pools page-aligned and at least
    ``smallest_pool``, a chunk of at least a page, EAGLE's chain filled in, and the context
    limit set so admission — prompt + new tokens + a page, charged against the smaller pool
    — fits beside the page each open session's slot may pin in each pool (#27024: pinned
    session KV is never evictable, so a pool smaller than that stalls by configuration)."""
    fields = dict(fields)
    ps = int(fields["page_size"])
    floor = smallest_pool(ps)
    tokens = max(paging.ceil_align(int(fields["max_total_tokens"]), ps), floor)
    fields["max_total_tokens"] = tokens
    if fields.get("swa_tokens"):
        fields["swa_tokens"] = max(paging.ceil_align(int(fields["swa_tokens"]), ps), floor)
    if fields.get("chunked_prefill_size") is not None:
        fields["chunked_prefill_size"] = max(int(fields["chunked_prefill_size"]), ps)
    if fields.get("speculative"):
        spec = dict(fields["speculative"])
        steps = spec.setdefault("num_steps", 2)
        spec.setdefault("num_draft_tokens", steps + 1)
        spec.setdefault("accept_prob", 0.6)
        fields["speculative"] = spec
    smallest = min(tokens, fields.get("swa_tokens") or tokens)
    pinned = MAX_OPEN_SESSIONS * ps
    fields["context_len"] = min(
        smallest - NEW_MAX - 2 * ps - pinned - 16, 512 if ps < 256 else 1024
    )
    return fields


def smallest_pool(ps: int) -> int:
    """The fewest tokens a pool of the swarm has: eight pages, and room for a context of
    MIN_CONTEXT tokens with its new tokens beside the pages the open sessions pin."""
    room = MIN_CONTEXT + NEW_MAX + 16 + (MAX_OPEN_SESSIONS + 2) * ps
    return max(paging.ceil_align(room, ps), 8 * ps)


def sample_weights(rng: np.random.Generator) -> dict[str, float]:
    """Base weights scaled log-uniformly (×¼…×4); whole features off; some seeds calm."""
    weights = {
        k: w * float(np.exp(rng.uniform(np.log(0.25), np.log(4.0))))
        for k, w in BASE_WEIGHTS.items()
    }
    calm = rng.random() < CALM_PROB
    for kinds in FEATURES.values():
        if calm or rng.random() < FEATURE_OFF_PROB:
            weights.update(dict.fromkeys(kinds, 0.0))
    return weights


def sample_prompts(rng: np.random.Generator, engine: EngineSpec) -> PromptShape:
    """Shared heads up to a third of the input limit; suffixes up to half of it."""
    limit = engine.engine_config(seed=0).max_req_input_len  # the seed plays no part in the limit
    head_len = int(rng.integers(4, max(5, limit // 3)))
    heads = tuple(
        tuple(int(t) for t in rng.integers(0, 256, head_len))
        for _ in range(int(rng.integers(1, 5)))
    )
    return PromptShape(heads, max(2, limit // 2), int(rng.choice([8, 16, 32, NEW_MAX])), limit)
