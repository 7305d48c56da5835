"""Which adapter drives a real SGLang release, asked of its code (`make test-sglang`): the
banner names the adapter and every probe's answer with its reason — 0.5.23 runs on the
runtime-context adapter, 0.5.10.post1 on the legacy one, whose ReqToTokenPool hands out row
0 — and an internal no adapter drives is one line of adapter drift naming it, never a
traceback."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from invariants.cli import main
from invariants.targets.driver import AdapterDrift
from invariants.targets.sglang_scheduler.adapter import release_supports
from invariants.targets.sglang_scheduler.releases import SchedulerDriver

pytestmark = pytest.mark.sglang
ERA_PROBES = {"launch", "seams", "checks", "slot_layout", "req_kv", "row_zero", "speculative"}


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


DEV = """
import os, runpy, sys
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "..", "..", "sglang", "driver"))
import stubs
stubs.install()
import sglang
sglang.__version__ = "0.5.24.dev5+g1a2b3c4"
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def wrapped_python(tmp_path: Path, base: Path, script: str) -> Path:
    """An interpreter that runs ``script`` (its SGLang patched) before the driver."""
    (tmp_path / "wrap.py").write_text(script)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {base} {tmp_path / "wrap.py"} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def test_a_development_version_runs_on_the_adapter_its_code_matches(latest, tmp_path, capsys):
    """A main-branch install reports a version no release has (``0.5.24.dev5+g…``): the
    version plays no part, the probes pick 0.5.23's adapter from its code, and a spec runs
    clean on it."""
    python = wrapped_python(tmp_path, latest.python, DEV)
    with SchedulerDriver(python=python) as driver:
        assert driver.version == "0.5.24.dev5+g1a2b3c4"
        assert driver.adapter == "adapter_context"
    args = ["run", "specs/matrix-base.yaml", "--target", "sglang-scheduler"]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--target-python", str(python)])
    printed = capsys.readouterr().out
    assert exited.value.code in (0, None), printed
    assert "SGLang 0.5.24.dev5+g1a2b3c4" in printed and "0 violations" in printed


def test_a_moved_internal_is_one_line_of_adapter_drift(latest, tmp_path, capsys):
    """0.5.23 with its SessionSlot's fields renamed (patched into the driver's SGLang before
    it starts): the slot-layout probe finds no layout a reader knows, the banner says drift
    naming the fields and the adapter, and `kvspec run` prints one line and exits 2."""
    python = wrapped_python(tmp_path, latest.python, MOVED)
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


def test_probe_prints_the_adapter_and_every_answer_with_its_reason(latest, capsys):
    """`kvspec sglang probe` names the adapter that drives the release, every probe's answer
    beside its reason, and what it drives beyond the plain features."""
    with pytest.raises(SystemExit) as done:
        main(["sglang", "probe", "--target-version", "0.5.23"])
    printed = capsys.readouterr().out
    assert done.value.code in (0, None)
    assert printed.startswith("sglang 0.5.23: adapter_context")
    assert "Scheduler.__init__ takes no gpu_id" in printed  # the launch probe's reason
    assert "drives beyond the plain features: speculative" in printed
