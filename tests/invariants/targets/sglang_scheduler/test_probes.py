"""The real-scheduler driver's probes, without SGLang: each answers from the code it is handed
(a signature, an attribute, a dataclass's fields) — never a version — and the answers pick the
adapter, the catalog ids a release does not promise and what it supports; an internal no
adapter drives is a drift naming it. Stand-in classes play SGLang's."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

TARGETS = Path(__file__).resolve().parents[4] / "invariants" / "targets"
PATHS = [str(TARGETS / "sglang_scheduler" / "driver"), str(TARGETS / "sglang" / "driver")]
DRIVER_MODULES = ("probes", "release_probes", "layouts", "reader", "records")


@pytest.fixture(scope="module")
def driver() -> Iterator[SimpleNamespace]:
    """The driver's probe and layout modules, imported as the driver imports them."""
    sys.path[:0] = PATHS
    try:
        yield SimpleNamespace(**{m: importlib.import_module(m) for m in DRIVER_MODULES})
    finally:
        del sys.path[: len(PATHS)]
        for name in DRIVER_MODULES:
            sys.modules.pop(name, None)


class NineArgScheduler:
    def __init__(self, server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, *ranks):
        pass

    def recv_requests(self):
        pass


class TwoArgScheduler:
    def __init__(self, server_args, port_args):
        pass


def publish(server_args, *, role, ranks=None):
    pass


def test_the_launch_probe_reads_the_schedulers_signature(driver):
    """gpu_id among Scheduler.__init__'s parameters: the driver inits torch.distributed
    (gloo); none, with publish(ranks=) and SpawnRanks: the runtime context launches it."""
    probes = driver.probes
    context = SimpleNamespace(publish=publish, SpawnRanks=object)
    assert probes.launch(NineArgScheduler, None).answer == "gloo"
    assert probes.launch(TwoArgScheduler, context).answer == "context"
    with pytest.raises(probes.Drift, match="publish no ranks="):
        probes.launch(TwoArgScheduler, SimpleNamespace(publish=lambda server_args, *, role: 0))
    assert probes.seams(NineArgScheduler).answer == "scheduler"


def slot(*names: str) -> type:
    return dataclasses.make_dataclass("SessionSlot", [(n, object, None) for n in names])


def test_the_slot_and_record_probes_read_dataclass_fields(driver):
    """A session slot's layout and a request's KV record come from the dataclasses' fields;
    fields no reader knows are a drift naming them."""
    probes = driver.probes
    assert probes.slot_layout(slot("kv", "lock", "publishes_prompt")).answer == "lock"
    assert probes.slot_layout(slot("kv", "last_node", "lock_receipt")).answer == "moved"
    assert probes.slot_layout(slot("req_pool_idx", "kv", "last_node")).answer == "split"
    flat = slot("req_pool_idx", "kv_committed_len", "kv_allocated_len", "last_node")
    assert probes.slot_layout(flat).answer == "flat"
    with pytest.raises(probes.Drift, match="SessionSlot fields"):
        probes.slot_layout(slot("tokens"))
    record = dataclasses.make_dataclass("ReqKvInfo", ["req_pool_idx", "kv_allocated_len"])
    split = dataclasses.make_dataclass("ReqKvInfo", ["kv_allocated_len", "swa_evicted_seqlen"])
    assert probes.req_kv(SimpleNamespace(ReqKvInfo=record)).answer == "record"
    assert probes.req_kv(SimpleNamespace(ReqKvInfo=split)).answer == "split"
    assert probes.req_kv(ModuleType("schedule_batch")).answer == "flat"


class RowsFromZero:
    first = 0

    def __init__(self, size: int, **kwargs: object) -> None:
        self.free_slots = list(range(self.first, size))


class RowsFromOne(RowsFromZero):
    first = 1


def test_row_zero_is_asked_of_a_fresh_pool(driver):
    """Row 0 handed out or reserved: what a fresh ReqToTokenPool(size=2) lists as free."""
    assert driver.probes.row_zero(RowsFromZero).answer == "handed_out"
    assert driver.probes.row_zero(RowsFromOne).answer == "reserved"


def test_the_answers_pick_the_adapter_the_waivers_and_the_features(driver):
    """The era's two answers name the adapter (a pair no adapter drives is a drift); the
    banner says each answer with its reason; row 0 handed out waives the row rule, spec v2's
    commit at resolve (with eagle-v2) the two spec-v2 rules; eagle-v2 is 'speculative'."""
    probes, release = driver.probes, driver.release_probes
    found = probes.Probes(
        (
            ("launch", probes.Found("gloo", "a 9-argument Scheduler")),
            ("seams", probes.Found("components", "a request_receiver")),
            ("row_zero", probes.Found("handed_out", "free_slots holds row 0")),
            ("spec_commit", probes.Found("unknown", "no _resolve_spec_v2_tokens")),
            ("speculative", probes.Found("eagle-v2", "spec v2 only")),
            ("kv_pools", probes.Found("none", "no pool builder")),
        )
    )
    assert release.adapter_of(list(found.found)) == "adapter_components"
    assert found.banner()["launch"] == "gloo: a 9-argument Scheduler"
    assert list(release.not_applicable(found)) == ["req_pool.row_zero_reserved"]
    assert release.supports(found) == ["speculative"]
    era = [("launch", probes.Found("context", "")), ("seams", probes.Found("scheduler", ""))]
    with pytest.raises(probes.Drift, match=r"no adapter drives .*\(adapter: probes\)"):
        release.adapter_of(era)


def test_a_split_record_is_one_object_per_owner(driver):
    """Where a request's allocated length lives apart (``req.kv``), its record is one object
    per request, so the reader's identity checks hold; a released ``kv`` reads as none."""
    records = driver.layouts.KvRecords("split")
    req = SimpleNamespace(req_pool_idx=3, kv_committed_len=5, cache_protected_len=4, kv=None)
    assert records(req) is records(req)
    assert (records(req).req_pool_idx, records(req).kv_allocated_len) == (None, 0)
    req.kv = SimpleNamespace(kv_allocated_len=8)
    assert (records(req).req_pool_idx, records(req).kv_allocated_len) == (3, 8)
    assert driver.layouts.KvRecords("record")(req) is req.kv
    root = SimpleNamespace(parent=None, id=0)
    assert driver.layouts.lock_id(SimpleNamespace(parent=root, id=7)) == 7
    assert driver.layouts.lock_id(root) is None and driver.layouts.lock_id(object()) is None
