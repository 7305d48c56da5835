"""Mutations of a trace the explorer kept for its coverage: a new configuration on one knob
(a matrix axis, the chunk, the window, the pool, the retract interval, EOS), the ops thinned,
repeated, stretched or re-aimed, fresh ops appended, or a stretch of another kept trace
spliced in — each drawn from a seeded generator, so a campaign replays exactly.

Keeps: every mutant is a valid trace the engine accepts: the configuration honours the
matrix's declared constraints and the swarm's pool floors (swarm.fit_pools), ops spliced in
or appended are renamed so no request or session id repeats, and the drain is rebuilt after
the mutated safety ops (generate.with_drain), so every mutant still ends idle and flushed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from invariants.explore.generate import PHASES, generate_ops, safety_part, scheduled, with_drain
from invariants.explore.swarm import (
    NEW_MAX,
    Swarm,
    fit_pools,
    sample_prompts,
    sample_weights,
)
from invariants.scenarios.matrix_axes import apply_axes, axis_values, load_matrix, violations
from invariants.scenarios.ops import Abort, Op, Submit, Trace, WaitFor
from invariants.scenarios.spec import EngineSpec

Ops = list[Op]
KNOBS: dict[str, tuple[object, ...]] = {  # non-axis engine knobs and the values they take
    "chunked_prefill_size": (None, 16, 32, 64, 128),
    "sliding_window": (8, 16, 32, 64),
    "test_retract_interval": (1, 2, 3, 5),
    "eos_prob": (0.0, 0.02, 0.1),
    "max_num_reqs": (5, 8, 12),
}


def mutate(
    trace: Trace, rng: np.random.Generator, donors: Sequence[Trace], tag: str, steps: int
) -> Trace:
    """One mutant of ``trace`` (``tag``: the prefix of any id it adds), at most ``steps``
    scheduled iterations long before its drain (a mutant grows no longer than a seed)."""
    if rng.random() < 0.3:
        trace = trace.model_copy(update={"engine": mutate_engine(trace.engine, rng)})
    ops = safety_part(trace.ops)
    operators: list[Callable[[str], Ops]] = [  # each step's ids get their own prefix
        lambda _: _drop(ops, rng),
        lambda t: _repeat(ops, rng, t),
        lambda _: _stretch(ops, rng),
        lambda _: _reaim(ops, rng),
        lambda t: _append(trace.engine, ops, rng, t),
        lambda t: _splice(ops, donors, rng, t),
    ]
    for step in range(1 + int(rng.integers(3))):  # stacked, as AFL's havoc stage
        ops = operators[int(rng.integers(len(operators)))](f"{tag}.{step}")
    while scheduled(ops) > steps:
        ops = _drop(ops, rng)
    return trace.model_copy(update={"ops": with_drain(ops), "name": f"explore-{tag}"})


def mutate_engine(engine: EngineSpec, rng: np.random.Generator) -> EngineSpec:
    """The engine with one knob redrawn: a matrix axis (within its constraints; MLA only on
    the tiny model, as in the swarm), or one of ``KNOBS``; the pools re-fitted to the swarm's
    floors."""
    fields = engine.model_dump()
    matrix = load_matrix()
    axes = [a for a in matrix.axes if a != "attention"] + ["attention"]
    knobs = [*axes, *KNOBS, "streaming", "pool"]
    knob = knobs[int(rng.integers(len(knobs)))]
    if knob in matrix.axes:
        row = axis_values(fields)
        mla = fields["model"] == "tiny"
        values = [v for v in matrix.axes[knob] if (mla or v != "mla") and v != row[knob]]
        row[knob] = values[int(rng.integers(len(values)))]
        if violations(row, matrix):
            return engine
        fields = apply_axes(fields, {knob: row[knob]})
    elif knob in KNOBS:
        choices = KNOBS[knob]
        fields[knob] = choices[int(rng.integers(len(choices)))]
    elif knob == "streaming":
        fields["enable_streaming_session"] = not fields["enable_streaming_session"]
    else:  # the pool: halved or doubled, the floors still apply
        fields["max_total_tokens"] = int(fields["max_total_tokens"] * rng.choice([0.5, 2.0]))
    fields = fit_pools(fields)  # sizes the SWA pool of an engine made hybrid
    radix = fields["cache"] == "radix" and not fields["swa_tokens"]  # as swarm.sample_options
    fields["session_radix_cache"] = fields["session_radix_cache"] and radix
    return EngineSpec.model_validate(fields)


def _drop(ops: Ops, rng: np.random.Generator) -> Ops:
    """A random stretch of ops removed (a shrink step at random)."""
    if len(ops) < 2:
        return ops
    a = int(rng.integers(len(ops)))
    b = min(len(ops), a + 1 + int(rng.integers(max(1, len(ops) // 4))))
    return ops[:a] + ops[b:]


def _repeat(ops: Ops, rng: np.random.Generator, tag: str) -> Ops:
    """A stretch of ops run again right after itself, its ids renamed."""
    if not ops:
        return ops
    a = int(rng.integers(len(ops)))
    b = min(len(ops), a + 1 + int(rng.integers(8)))
    return ops[:b] + renamed(ops[a:b], f"{tag}d") + ops[b:]


def _stretch(ops: Ops, rng: np.random.Generator) -> Ops:
    """Requests asking for more (or fewer) new tokens, up to the swarm's ``NEW_MAX`` (the
    pools are sized for it): long decodes slide windows and fill pools."""
    factor = float(rng.choice([0.25, 2.0, 4.0]))
    return [
        op.model_copy(
            update={"max_new_tokens": max(1, min(NEW_MAX, int(op.max_new_tokens * factor)))}
        )
        if isinstance(op, Submit) and rng.random() < 0.5
        else op
        for op in ops
    ]


def _reaim(ops: Ops, rng: np.random.Generator) -> Ops:
    """Aborts re-aimed at another phase (waiting, running, mid-chunk, any)."""
    return [
        op.model_copy(update={"rid": None, "phase": PHASES[int(rng.integers(len(PHASES)))]})
        if isinstance(op, Abort)
        else op
        for op in ops
    ]


def _append(engine: EngineSpec, ops: Ops, rng: np.random.Generator, tag: str) -> Ops:
    """Fresh safety ops, drawn on this trace's engine with a new op mix, inserted."""
    swarm = Swarm(engine, sample_weights(rng), sample_prompts(rng, engine), 0.8)
    fresh = generate_ops(swarm, rng, int(rng.choice([16, 64, 128])), prefix=f"{tag}a")
    at = int(rng.integers(len(ops) + 1))
    return ops[:at] + fresh + ops[at:]


def _splice(ops: Ops, donors: Sequence[Trace], rng: np.random.Generator, tag: str) -> Ops:
    """A stretch of another kept trace's ops inserted, its ids renamed."""
    if not donors:
        return ops
    donor = safety_part(donors[int(rng.integers(len(donors)))].ops)
    if not donor:
        return ops
    a = int(rng.integers(len(donor)))
    piece = renamed(donor[a : a + 1 + int(rng.integers(24))], f"{tag}s")
    at = int(rng.integers(len(ops) + 1))
    return ops[:at] + piece + ops[at:]


def renamed(ops: Ops, prefix: str) -> Ops:
    """``ops`` with every request and session id prefixed (references follow)."""

    def name(x: str | None) -> str | None:
        return None if x is None else f"{prefix}-{x}"

    out: Ops = []
    for op in ops:
        update: dict[str, object] = {}
        for attr in ("rid", "sid"):
            if getattr(op, attr, None) is not None:
                update[attr] = name(getattr(op, attr))
        if isinstance(op, WaitFor):
            update["rids"] = [name(r) for r in op.rids]
        session = getattr(op, "session", None)
        if session is not None:
            update["session"] = session.model_copy(
                update={"id": name(session.id), "rid": name(session.rid)}
            )
        out.append(op.model_copy(update=update))
    return out


__all__ = ["KNOBS", "mutate", "mutate_engine", "renamed"]
