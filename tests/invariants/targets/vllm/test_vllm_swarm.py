"""What `kvspec explore --target vllm` draws (no vLLM needed): a KV connector in about a
third of the seeds, in all three roles, a Mamba group in about a quarter, and EAGLE drafts
under async scheduling as well as without it; these are vLLM's only — kvspec's engine
refuses them before anything runs and the SGLang targets name them unsupported."""

from __future__ import annotations

import pytest

from engine.errors import ConfigError
from invariants.checking.loader import load_catalog
from invariants.scenarios.matrix import ROOT
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import load_spec
from invariants.scenarios.trace_run import run_trace
from invariants.targets.vllm.adapter import label, swarm


def test_the_swarm_draws_connectors_and_async_drafts() -> None:
    """Over 90 seeds: connectors in each role at 20-45% of seeds, Mamba groups at 11-39%,
    async EAGLE in some, and the label names the connector."""
    engines = [swarm(seed).engine for seed in range(90)]
    roles = [e.kv_connector.role for e in engines if e.kv_connector]
    assert 18 <= len(roles) <= 40 and set(roles) == {"kv_consumer", "kv_producer", "kv_both"}
    assert any(e.speculative and e.enable_overlap for e in engines)
    assert any(e.speculative and not e.enable_overlap for e in engines)
    assert 10 <= sum(e.mamba_group for e in engines) <= 35
    seed = next(s for s, e in enumerate(engines) if e.kv_connector)
    assert engines[seed].kv_connector.role in label(swarm(seed))


def test_connector_specs_are_vllm_only() -> None:
    """kvspec's engine has no connector API: a clear error naming the field; the SGLang
    targets say it unsupported."""
    from invariants.targets.sglang_scheduler.adapter import unsupported

    trace = build_trace(load_spec(ROOT / "specs" / "vllm" / "kv-connector-producer.yaml"))
    with pytest.raises(ConfigError, match="kv_connector"):
        run_trace(trace, load_catalog())
    assert any("kv_connector" in why for why in unsupported(trace))
