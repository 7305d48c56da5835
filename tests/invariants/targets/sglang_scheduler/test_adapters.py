"""Which adapter drives a real SGLang release, asked of its code (`make test-sglang`): the
banner names the adapter and every probe's answer with its reason — 0.5.23 runs on the
runtime-context adapter, 0.5.10.post1 on the legacy one, whose ReqToTokenPool hands out row
0 — and an internal no adapter drives is one line of adapter drift naming it, never a
traceback."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from invariants.cli import main
from invariants.targets.driver import AdapterDrift
from invariants.targets.sglang_scheduler.adapter import release_supports
from invariants.targets.sglang_scheduler.releases import SchedulerDriver, installed_versions

pytestmark = pytest.mark.sglang
ERA_PROBES = {"launch", "seams", "checks", "slot_layout", "req_kv", "row_zero", "speculative"}


def driver_of(version: str) -> Iterator[SchedulerDriver]:
    if version not in installed_versions():
        pytest.skip(f"sglang {version}: make sglang-env SGLANG_VERSION={version}")
    with SchedulerDriver(version) as driver:
        yield driver


@pytest.fixture(scope="module")
def latest() -> Iterator[SchedulerDriver]:
    yield from driver_of("0.5.23")


@pytest.fixture(scope="module")
def unfixed() -> Iterator[SchedulerDriver]:
    yield from driver_of("0.5.10.post1")


def test_0_5_23_runs_on_the_runtime_context_adapter(latest):
    """0.5.23's Scheduler takes no gpu_id (ranks published, its own bootstrap), its seams are
    components, its slots keep a TreeLock; it drives speculative decoding (spec v2 only) and
    hybrid SWA and MLA pools (its KVCacheConfigurator builds them)."""
    assert latest.adapter == "adapter_context"
    assert ERA_PROBES <= set(latest.probes)
    assert latest.probes["launch"].startswith("context: ")
    assert latest.probes["seams"].startswith("components: ")
    assert latest.probes["slot_layout"].startswith("lock: ")
    assert latest.probes["row_zero"].startswith("reserved: ")
    assert latest.probes["kv_pools"].startswith("configurator: ")
    assert latest.probes["swa_cursor"].startswith("component: ")
    assert latest.banner["supports"] == ["speculative", "swa", "mla"]
    assert release_supports("0.5.23") == frozenset({"speculative", "swa", "mla"})
    assert "req_pool.row_zero_reserved" not in latest.not_applicable


def test_0_5_10_post1_runs_on_the_legacy_adapter(unfixed):
    """0.5.10.post1's Scheduler takes gpu_id and the ranks, receives through itself, keeps
    no session flags, hands out row 0 (waived, from the probe) and drives no draft worker;
    its model runner's pool mixin builds hybrid SWA (splitting the cap by bytes, fitted) and
    MLA pools, and its busy check is not hybrid-aware (skipped on SWA pools)."""
    assert unfixed.adapter == "adapter_legacy"
    assert unfixed.probes["launch"].startswith("gloo: ")
    assert unfixed.probes["seams"].startswith("scheduler: ")
    assert unfixed.probes["session_flags"].startswith("liveness: ")
    assert unfixed.probes["row_zero"].startswith("handed_out: ")
    assert "req_pool.row_zero_reserved" in unfixed.not_applicable
    assert unfixed.probes["kv_pools"].startswith("mixin: ")
    assert unfixed.probes["swa_split"].startswith("bytes: ")
    assert unfixed.probes["swa_check"].startswith("no: ")
    assert unfixed.banner["supports"] == ["swa", "mla"]
    assert release_supports("0.5.10.post1") == frozenset({"swa", "mla"})


MOVED = """
import dataclasses, os, runpy, sys
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "..", "..", "sglang", "driver"))
import stubs
stubs.install()
from sglang.srt.session import streaming_session
streaming_session.SessionSlot = dataclasses.make_dataclass("SessionSlot", ["tokens"])
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_moved_internal_is_one_line_of_adapter_drift(latest, tmp_path, capsys):
    """0.5.23 with its SessionSlot's fields renamed (patched into the driver's SGLang before
    it starts): the slot-layout probe finds no layout a reader knows, the banner says drift
    naming the fields and the adapter, and `kvspec run` prints one line and exits 2."""
    (tmp_path / "moved.py").write_text(MOVED)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {latest.python} {tmp_path / "moved.py"} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(AdapterDrift, match=r"slot_layout: SessionSlot fields \['tokens'\]"):
        SchedulerDriver(python=python)
    args = ["run", "specs/matrix-base.yaml", "--target", "sglang-scheduler"]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--target-python", str(python)])
    printed = capsys.readouterr().err
    assert exited.value.code == 2 and printed.count("\n") == 1, printed
    assert printed.startswith("kvspec: adapter drift:") and "Traceback" not in printed
    assert "(adapter: adapter_context)" in printed
    assert str(Path("driver") / "adapter_context.py") in printed
