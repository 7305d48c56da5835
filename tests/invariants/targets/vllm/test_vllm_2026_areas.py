"""Where vLLM's 2026 block-accounting bugs live, on its real v1 scheduler (0.33.0): the KV-
connector API (the seeded connector as a consumer — sync and async loads, deferred lookups,
load failures — and as a producer, frees delayed while the KV is sent), EAGLE under the
AsyncScheduler (placeholder drafts) and a Mamba group beside full and sliding-window
attention run clean, the census counting what an in-flight transfer holds as an owner. One
planted fault per area is caught naming the block: a deferred free released early and a
block freed under the step in flight (``vllm.in_flight_blocks_not_free``), a Mamba state
block freed while its table lists it (the census and vLLM's ref-count rules)."""

from __future__ import annotations

import ast

import pytest

from invariants.checking.loader import load_catalog
from invariants.scenarios.matrix import ROOT
from invariants.scenarios.spec import load_spec
from invariants.targets.registry import target
from invariants.targets.run import run_spec

pytestmark = pytest.mark.vllm
CATALOG = load_catalog()
VLLM = target("vllm")


def _note(out, prefix: str) -> str:
    return next(n for n in out.notes if n.startswith(prefix))


def _counts(out) -> dict[str, int]:
    pairs = _note(out, "connector: ").removeprefix("connector: ").split(", ")
    return {k: int(v) for k, v in (p.rsplit(" ", 1) for p in pairs)}


def test_a_consumer_connector_runs_clean_its_loads_and_deferred_frees_counted() -> None:
    """Async loads (the request waits holding its blocks), failed loads (recomputed),
    deferred lookups; under the AsyncScheduler a consumer fences frees behind the step in
    flight. Every view's census counts the blocks a load and a deferred free hold as owned;
    no rule fires, every request ends."""
    spec = load_spec(ROOT / "specs" / "vllm" / "kv-connector-consumer.yaml")
    out = run_spec(VLLM, spec, CATALOG)
    assert out.ok and not out.unmet, (out.error, out.violations[:3], out.unmet)
    counts = _counts(out)
    assert counts["async_loads"] and counts["failed_loads"] and counts["defers"], counts
    assert {"load", "deferred", "req"} <= set(_note(out, "block owners: ")[14:].split(", "))
    assert "scheduler: AsyncScheduler" in out.notes and out.stats.aborted


def test_a_producer_connector_delays_frees_until_the_kv_is_sent() -> None:
    """A finished request whose KV is being sent keeps its blocks (owner ``send:``) until the
    send finishes; the engine is idle only after every send (vLLM's ``has_requests()``),
    and then every block is free."""
    spec = load_spec(ROOT / "specs" / "vllm" / "kv-connector-producer.yaml")
    out = run_spec(VLLM, spec, CATALOG)
    assert out.ok and not out.unmet, (out.error, out.violations[:3], out.unmet)
    assert _counts(out)["sends"] > 0
    assert "send" in _note(out, "block owners: ")


def test_eagle_under_the_async_scheduler_runs_clean_with_preemption() -> None:
    """Placeholder drafts under the AsyncScheduler, preempted and aborted requests among
    them: drafts verified and accepted, no rule fires."""
    out = run_spec(VLLM, load_spec(ROOT / "specs" / "vllm" / "async-eagle.yaml"), CATALOG)
    assert out.ok and not out.unmet, (out.error, out.violations[:3], out.unmet)
    assert "scheduler: AsyncScheduler" in out.notes and out.stats.preempted
    accepted, verified = ast.literal_eval(
        "(" + _note(out, "drafts accepted: ")[17:].replace(" of ", ",").split(" ")[0] + ")"
    )
    assert 0 < accepted < verified


def test_a_mamba_group_beside_attention_runs_clean_in_both_cache_modes() -> None:
    """Full, sliding-window and Mamba groups over one pool: under prefix caching (Mamba's
    align mode) with hits, preemption and aborts, and without (mode none): no rule fires."""
    from invariants.scenarios.spec import parse_overrides

    path = ROOT / "specs" / "vllm" / "mamba-hybrid.yaml"
    cached = run_spec(VLLM, load_spec(path), CATALOG)
    assert cached.ok and not cached.unmet, (cached.error, cached.violations[:3])
    assert cached.stats.cached_tokens and cached.stats.preempted and cached.stats.aborted
    plain = run_spec(VLLM, load_spec(path, parse_overrides(["cache=chunk"])), CATALOG)
    assert plain.error is None and plain.violations == (), (plain.error, plain.violations[:3])


def test_a_mamba_state_block_freed_while_listed_is_caught() -> None:
    """A Mamba group's current state block returned to the pool while the table lists it:
    the census (free yet referenced) and vLLM's ref-count rules name the block."""
    spec = load_spec(ROOT / "specs" / "vllm" / "mamba-hybrid.yaml")
    out = run_spec(VLLM, spec, CATALOG, fault={"kind": "mamba_state_freed", "step": 5})
    (block,) = ast.literal_eval(_note(out, "fault fired").split("blocks ")[1])
    named = {v.invariant for v in out.violations if f"block {block}:" in str(v)}
    named |= {v.invariant for v in out.violations if f"page {block} " in str(v)}
    assert {"census.no_dangling", "vllm.ref_cnt_is_holders"} <= named, out.violations[:3]


@pytest.mark.parametrize(
    ("kind", "spec"),
    [("early_deferred_free", "kv-connector-consumer"), ("spec_rehome", "async-eagle")],
)
def test_a_block_freed_under_the_step_in_flight_is_caught(kind: str, spec: str) -> None:
    """A preempted or finished request's blocks freed at once though a consumer connector
    fences them (``early_deferred_free``); a rejected tail block re-homed and freed while
    the next step writes it (``spec_rehome``): the rule names a block the fault freed."""
    loaded = load_spec(ROOT / "specs" / "vllm" / f"{spec}.yaml")
    out = run_spec(VLLM, loaded, CATALOG, fault={"kind": kind, "step": 5})
    fired = ast.literal_eval(_note(out, "fault fired").split("blocks ")[1])
    caught = [v for v in out.violations if v.invariant == "vllm.in_flight_blocks_not_free"]
    assert fired and caught, (fired, out.violations[:3])
    assert any(f"{b}," in str(v) or f"{b}]" in str(v) for b in fired for v in caught), caught[:2]


def test_the_preemption_cascade_reproduces_on_0_29_and_not_on_0_30() -> None:
    """vllm#49674, read from both releases' ``Scheduler.schedule``: with a consumer connector
    under async scheduling a preempted request's blocks are fenced behind the step in flight,
    so 0.29.0 preempts request after request for one allocation (``vllm.preemption_makes_
    room`` names them); 0.30.0 stops preempting there ("A deferred free will not help with
    immediate allocation") and the same spec is clean."""
    from invariants.targets.registry import TargetOptions

    spec = load_spec(ROOT / "specs" / "vllm" / "kv-connector-consumer.yaml")
    for release in ("0.29.0", "0.30.0"):
        if not (ROOT / f".vllm-venv-{release}" / "bin" / "python").exists():
            pytest.skip(f"no .vllm-venv-{release}: make vllm-env VLLM_VERSION={release}")
    old = run_spec(VLLM, spec, CATALOG, options=TargetOptions(version="0.29.0"))
    cascade = [v for v in old.violations if v.invariant == "vllm.preemption_makes_room"]
    assert cascade and "fenced behind the step in flight" in str(cascade[0]), old.violations[:2]
    fixed = run_spec(VLLM, spec, CATALOG, options=TargetOptions(version="0.30.0"))
    assert fixed.ok, (fixed.error, fixed.violations[:2])
