"""Every engine option is drawn by the explorer (invariants/explore/swarm.py), and the
boundary values of sessions are reached (invariants/explore/generate.py) and counted as
required goals (invariants/explore/features.py): an option the swarm cannot draw is a mode
the default gate never runs, so adding an EngineSpec field the swarm does not draw fails
here, naming the field."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from engine.config.speculative import SpecConfig
from invariants.explore.explorer import default_catalog
from invariants.explore.features import FeatureProbe, goals_of, outcome_features
from invariants.explore.generate import generate_trace
from invariants.explore.swarm import sample_swarm
from invariants.scenarios.ops import (
    CloseSession,
    OpenSession,
    SessionRef,
    Submit,
    Trace,
    WaitFor,
)
from invariants.scenarios.spec import VLLM_ONLY, EngineSpec
from invariants.scenarios.trace_run import run_trace

SEEDS = range(400)


def _values(items: list[Any]) -> set[str]:
    return {json.dumps(v, sort_keys=True) for v in items}


def test_every_engine_option_is_drawn_with_more_than_one_value() -> None:
    """Over 400 seeds each EngineSpec field, and each EAGLE field with a choice, takes at
    least two values (session tags, the retract interval and a running cap included); the
    vLLM-only fields are the vllm target's swarm's (tests/invariants/targets/vllm/
    test_vllm_swarm.py)."""
    engines = [sample_swarm(seed).engine for seed in SEEDS]
    for name in set(EngineSpec.model_fields) - set(VLLM_ONLY):
        drawn = _values([getattr(e, name) for e in engines])
        assert len(drawn) > 1, f"EngineSpec.{name} is never drawn by the swarm: only {drawn}"
    specs = [e.speculative for e in engines if e.speculative]
    for f in dataclasses.fields(SpecConfig):
        if f.name == "algorithm":
            continue  # "eagle" is the one algorithm there is (a top-1 chain)
        drawn = _values([{**dataclasses.asdict(SpecConfig()), **s}[f.name] for s in specs])
        assert len(drawn) > 1, f"speculative.{f.name} is never drawn by the swarm: only {drawn}"


def test_session_tags_are_drawn_only_where_the_cache_allows_them() -> None:
    """Session tags need the full-attention radix cache; every drawn engine is valid."""
    engines = [sample_swarm(seed).engine for seed in SEEDS]
    tagged = [e for e in engines if e.session_radix_cache]
    assert tagged and all(e.cache == "radix" and e.swa_tokens is None for e in tagged)
    for seed, engine in zip(SEEDS, engines):
        engine.engine_config(seed)  # raises ConfigError on an invalid combination


def test_the_generator_draws_the_boundary_turns() -> None:
    """Some seeds send an empty turn, a one-token turn, a page-long one at page size > 1, an
    empty plain prompt, and close a session right after opening it."""
    found: set[str] = set()
    for seed in range(80):
        trace = generate_trace(seed, 300)
        ps = trace.engine.page_size
        ops = trace.ops
        for op, after in zip(ops, [*ops[1:], None]):
            if isinstance(op, Submit):
                n = len(op.input_ids)
                found.add(
                    ("turn:" if op.session else "prompt:") + ("page" if n == ps > 1 else str(n))
                )
            if isinstance(op, OpenSession) and isinstance(after, CloseSession):
                found.add("close_at_once")
    assert {"turn:0", "turn:1", "turn:page", "prompt:0", "close_at_once"} <= found


def test_boundary_goals_are_read_from_what_happened() -> None:
    """Session tags on, page size 4: a session closed before its first turn, turns of one
    token and of exactly a page, an empty turn refused (400)."""
    ref = SessionRef(id="s")
    trace = Trace(
        name="boundaries",
        seed=1,
        engine=EngineSpec(
            page_size=4, max_total_tokens=1024, context_len=256, session_radix_cache=True
        ),
        ops=[
            OpenSession(sid="early"),
            CloseSession(sid="early"),
            OpenSession(sid="s"),
            Submit(rid="a", input_ids=list(range(1, 13)), max_new_tokens=3, session=ref),
            WaitFor(rids=["a"]),
            Submit(rid="b", input_ids=[7], max_new_tokens=3, session=SessionRef(id="s", rid="a")),
            WaitFor(rids=["b"]),
            Submit(
                rid="c",
                input_ids=[1, 2, 3, 4],
                max_new_tokens=3,
                session=SessionRef(id="s", rid="b"),
            ),
            WaitFor(rids=["c"]),
            Submit(rid="d", input_ids=[], max_new_tokens=3, session=SessionRef(id="s", rid="c")),
        ],
    )
    probe = FeatureProbe()
    outcome = run_trace(trace, default_catalog(), observers=[probe])
    assert outcome.ok, outcome.describe()
    met = goals_of(probe.features | outcome_features(outcome))
    want = {"session_radix", "turn_one_token", "turn_exact_page", "turn_empty", "close_before_turn"}
    assert want <= met, want - met
