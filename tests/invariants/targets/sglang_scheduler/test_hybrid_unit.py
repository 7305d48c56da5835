"""Hybrid SWA and MLA on the sglang-scheduler target, without sglang: the probes that pick the
release's own pool builder (and refuse the features where none is found), the pure logic of
the driver's hybrid modules (0.5.10.x's byte-split fit, a row's owned SWA span), and the
kvspec side's mapping of a spec onto the config op (a spec asking for MLA never runs on an
MHA pool)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import EngineSpec
from invariants.targets.sglang_scheduler import adapter
from invariants.targets.sglang_scheduler.releases import SUPPORTS_SEEN

TARGETS = Path(__file__).resolve().parents[4] / "invariants" / "targets"
PATHS = [str(TARGETS / "sglang_scheduler" / "driver"), str(TARGETS / "sglang" / "driver")]
MODULES = ("probes", "release_probes", "hybrid_pools", "hybrid_reader", "pools", "worker")


@pytest.fixture(scope="module")
def driver() -> Iterator[SimpleNamespace]:
    """The driver's modules, imported as the driver imports them (no sglang needed)."""
    sys.path[:0] = PATHS
    try:
        yield SimpleNamespace(**{m: importlib.import_module(m) for m in MODULES})
    finally:
        del sys.path[: len(PATHS)]
        for name in (*MODULES, "reader", "records"):
            sys.modules.pop(name, None)


class Configurator:
    def configure(self, *, pre_model_load_memory):
        pass


class Mixin:
    def init_memory_pool(self, pre_model_load_memory):
        pass


class ByteSplitMixin(Mixin):
    def _resolve_hybrid_swa_tokens(self, capacity):
        pass


class CursorRecord:
    def get_evicted_seqlen(self, component):
        pass


def test_the_pool_builder_probes_read_the_code(driver):
    """KVCacheConfigurator.configure wins over the mixin; neither: 'none', and the banner's
    supports then lacks swa and mla; a byte-splitting mixin is 'bytes'; a record with
    get_evicted_seqlen keeps the cursor per component; a busy check without _check_swa_pool
    is not hybrid-aware."""
    probes, release = driver.probes, driver.release_probes
    assert probes.kv_pools(Configurator, Mixin).answer == "configurator"
    assert probes.kv_pools(None, Mixin).answer == "mixin"
    assert probes.kv_pools(None, None).answer == "none"
    assert probes.swa_split(ByteSplitMixin).answer == "bytes"
    assert probes.swa_split(Mixin).answer == probes.swa_split(None).answer == "ratio"
    assert probes.swa_cursor(CursorRecord).answer == "component"
    assert probes.swa_cursor(None).answer == "field"
    assert probes.swa_check(Mixin, None).answer == "no"
    for pools, supports in (("mixin", ["swa", "mla"]), ("none", [])):
        found = probes.Probes(
            (
                ("speculative", probes.Found("no", "")),
                ("kv_pools", probes.Found(pools, "")),
            )
        )
        assert release.supports(found) == supports


class ByteSplitRunner:
    """0.5.10.x's split: the cap C is shared by bytes, full = C * (F + S) / (F + r * S),
    swa = full * r (F = S here: one full and one SWA layer of the same width)."""

    def __init__(self) -> None:
        self.server_args = SimpleNamespace(max_total_tokens=None, swa_full_tokens_ratio=0.8)

    def _resolve_token_capacity(self, profiled: int) -> int:
        return min(profiled, self.server_args.max_total_tokens)

    def _resolve_hybrid_swa_tokens(self, capacity: int) -> tuple[int, int, int]:
        ratio = self.server_args.swa_full_tokens_ratio
        full = int(capacity * 2 / (1 + ratio))
        return capacity, full // 4 * 4, int(full * ratio) // 4 * 4


def test_the_byte_split_is_fitted_to_the_traces_sizes(driver):
    """The (cap, ratio) a user would pass to get full=3072, swa=2048 from a byte split: the
    release's own split, run on them, gives exactly the trace's sizes."""
    runner = ByteSplitRunner()
    cfg = {"page_size": 4, "pool_tokens": 3072, "swa": {"tokens": 2048}}
    driver.hybrid_pools._fit_split(runner, cfg)
    cap = runner._resolve_token_capacity(1 << 40)
    assert runner._resolve_hybrid_swa_tokens(cap)[1:] == (3072, 2048)
    with pytest.raises(ValueError, match="cannot split"):
        driver.hybrid_pools._fit_split(runner, {**cfg, "swa": {"tokens": 4096}})


def test_a_row_owns_its_swa_span_above_the_cursor(driver):
    """Owned SWA: [cpl, dead_lo) + [max(evicted, dead_lo), ceil_page(allocated)); dead_lo is
    cpl for a record without swa_dead_lo (1x: allocated - max(cpl, evicted) tokens)."""
    kv = SimpleNamespace(cache_protected_len=16, kv_allocated_len=61)
    spans = driver.hybrid_reader.owned_spans(kv, 40, 4)
    assert spans == [(40, 64)]
    assert driver.hybrid_reader.owned_spans(kv, 0, 4) == [(16, 64)]
    floor = SimpleNamespace(**vars(kv), swa_dead_lo=lambda page: 24)
    assert driver.hybrid_reader.owned_spans(floor, 40, 4) == [(16, 24), (40, 64)]


def trace_of(engine: EngineSpec) -> Trace:
    return Trace(name="t", engine=engine, ops=[])


def test_the_config_op_carries_swa_and_mla_and_a_plain_op_stays_as_it_was():
    """swa_tokens/sliding_window become the op's ``swa``; model tiny with attention mla its
    ``mla``; a plain engine's op has neither key."""
    swa = EngineSpec(page_size=4, max_total_tokens=3072, swa_tokens=2048, sliding_window=32)
    assert adapter.config(trace_of(swa))["swa"] == {"window": 32, "tokens": 2048}
    mla = EngineSpec(model="tiny", tiny={"attention": "mla", "num_layers": 1})
    assert adapter.config(trace_of(mla))["mla"] is True
    plain = adapter.config(trace_of(EngineSpec()))
    assert "swa" not in plain and "mla" not in plain


def test_swa_and_mla_are_refused_where_the_driver_builds_no_such_pool(monkeypatch):
    """A release whose banner lacks swa/mla refuses them with the reason; a tiny model that is
    not MLA is refused as before (the fake forward), never run on some other pool."""
    swa = EngineSpec(swa_tokens=2048, sliding_window=32)
    mla = EngineSpec(model="tiny", tiny={"attention": "mla"})
    gqa = EngineSpec(model="tiny", tiny={"attention": "gqa"})
    monkeypatch.setitem(SUPPORTS_SEEN, "9.9.9", frozenset())
    assert any("swa_tokens" in why for why in adapter.unsupported_engine(swa, "9.9.9"))
    assert any("mla" in why for why in adapter.unsupported_engine(mla, "9.9.9"))
    monkeypatch.setitem(SUPPORTS_SEEN, "9.9.9", frozenset({"swa", "mla"}))
    assert adapter.unsupported_engine(swa, "9.9.9") == []
    assert adapter.unsupported_engine(mla, "9.9.9") == []
    assert any("model: tiny" in why for why in adapter.unsupported_engine(gqa, "9.9.9"))


def test_pools_the_release_did_not_build_as_asked_are_refused(driver):
    """An MLA config the release built without the MLA backend, or a hybrid SWA config whose
    window is not the trace's, is refused (ValueError: an op refused), never run on them."""
    refuse = driver.hybrid_pools.refuse_other_pools
    mha = SimpleNamespace(
        token_to_kv_pool=object(),
        use_mla_backend=False,
        is_hybrid_swa=False,
        sliding_window_size=None,
    )
    with pytest.raises(ValueError, match="mla"):
        refuse(mha, {"mla": True})
    with pytest.raises(ValueError, match="not window 32"):
        refuse(
            SimpleNamespace(**{**vars(mha), "is_hybrid_swa": True, "sliding_window_size": 31}),
            {"swa": {"window": 32}},
        )
    refuse(
        SimpleNamespace(**{**vars(mha), "is_hybrid_swa": True, "sliding_window_size": 32}),
        {"swa": {"window": 32}},
    )
    refuse(mha, {})
