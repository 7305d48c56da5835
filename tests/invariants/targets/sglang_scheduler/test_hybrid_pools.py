"""Hybrid SWA and MLA pools on SGLang's real scheduler, built by each release's own pool code
and checked by kvspec's catalog: sglang#29352 (``SWARadixCache._insert_helper`` frees a
tombstoned node's full KV while a running request locks it, a use-after-free SGLang's own
checks do not see) fires ``census.no_dangling`` on 0.5.10.post1 (and every release to 0.5.14,
the one before the fix: docs/benchmarks.md); 0.5.23 (UnifiedRadixCache with
FULL and SWA components) runs the same spec clean, its SWA pool read as a second PoolView and
its window cursors advancing; an MLA spec runs on SGLang's MLATokenToKVPool."""

from __future__ import annotations

from pathlib import Path

import pytest

from invariants.checking.loader import shipped_catalog
from invariants.scenarios.scenario import build_trace
from invariants.scenarios.spec import load_spec
from invariants.targets.registry import target
from invariants.targets.run import run_spec, run_trace, spec_catalog

pytestmark = pytest.mark.sglang
SCHEDULER = target("sglang-scheduler")
SPECS = Path(__file__).resolve().parents[4] / "specs"


def test_0_5_10_post1_frees_the_full_kv_a_running_request_reads(unfixed):
    """sglang#29352: an insert that revives a tombstoned SWARadixCache node frees the node's
    full KV (``_insert_helper`` guards only swa_lock_ref) while a running request, which
    locks the node, still reads those pages through its row: the census names the pages as
    dangling (referenced, yet free), and SGLang's own checks are silent."""
    assert "swa" in unfixed.banner["supports"]
    spec = load_spec(SPECS / "swa-hybrid.yaml")
    outcome = run_spec(SCHEDULER, spec, shipped_catalog(), driver=unfixed)
    assert not outcome.unsupported and outcome.error is None
    assert "census.no_dangling" in {v.invariant for v in outcome.violations}
    assert unfixed.built["allocator"] == "SWATokenToKVPoolAllocator"
    assert unfixed.built["tree_cache"] == "SWARadixCache"
    assert not outcome.findings


def test_0_5_23_runs_swa_hybrid_clean_on_its_own_hybrid_pools(latest):
    """The release's own SWAKVPool and SWATokenToKVPoolAllocator under UnifiedRadixCache(FULL,
    SWA): no violation; every view has the second PoolView "swa" (with the window), the tree
    is "swa_radix" with tombstones, and requests' SWA cursors advance past the window."""
    spec = load_spec(SPECS / "swa-hybrid.yaml")
    trace = build_trace(spec)
    catalog = spec_catalog(spec, shipped_catalog())
    outcome = run_trace(SCHEDULER, trace, catalog, driver=latest, keep_views=True)
    assert outcome.ok, (outcome.violations[:3], outcome.findings[:3], outcome.error)
    assert latest.built["swa_pool"] == ["MHATokenToKVPool", 2048]
    views = [v for v in outcome.views if getattr(v, "pools", None)]
    assert views and all([p.name for p in v.pools] == ["full", "swa"] for v in views)
    assert {p.sliding_window for v in views for p in v.pools if p.name == "swa"} == {32}
    assert {v.tree.kind for v in views} == {"swa_radix"}
    assert any(n.swa_tombstone for v in views for n in v.tree.nodes)
    assert max((r.swa_evicted_seqlen for v in views for r in v.reqs), default=0) > 32


def test_an_mla_spec_runs_on_the_releases_mla_pool(latest):
    """model tiny with attention mla: the driver builds SGLang's MLATokenToKVPool (a tiny
    DeepSeek-V3 config through the release's KVCacheConfigurator) and says so in the config
    answer; the spec runs clean."""
    assert "mla" in latest.banner["supports"]
    spec = load_spec(SPECS / "tiny-mla-retract.yaml")
    outcome = run_spec(SCHEDULER, spec, shipped_catalog(), driver=latest)
    assert not outcome.unsupported
    assert outcome.ok, (outcome.violations[:3], outcome.findings[:3], outcome.error)
    assert latest.built["kv_pool"] == "MLATokenToKVPool"
    assert latest.built["kv_lora_rank"] == 16
