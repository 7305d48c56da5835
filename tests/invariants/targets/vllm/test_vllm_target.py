"""vLLM v1's real Scheduler and KVCacheManager (0.33.0, CPU, only the model runner faked) under
kvspec's catalog: the engine-neutral specs run clean as written, with prefix hits and
evictions, the hybrid SWA spec as a full and a sliding-window KV-cache group, EAGLE v1 as
vLLM's EAGLE (lookahead slots reserved), overlap as the AsyncScheduler; a planted fault — a
skipped free, a double free, a prefix hit left unpinned, a window block freed early, draft
slots not reserved — is caught, the census or vLLM's own rules naming the block; the explorer
runs seeds that replay."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from invariants.bench.targets import bench_target
from invariants.checking.loader import load_catalog
from invariants.scenarios.matrix import ROOT
from invariants.scenarios.spec import load_spec
from invariants.targets.registry import TargetOptions, target
from invariants.targets.run import run_spec, run_trace

pytestmark = pytest.mark.vllm
CATALOG = load_catalog()
VLLM = target("vllm")


@pytest.mark.parametrize(
    "name", ["radix-eviction", "chunked-prefill-paged", "swa-hybrid", "eagle-v1-paged"]
)
def test_engine_neutral_specs_run_clean(name: str) -> None:
    """Every request finishes, the prefix cache hits and evicts, no invariant fires."""
    spec = load_spec(ROOT / "specs" / f"{name}.yaml", {"test_retract": False})
    out = run_spec(VLLM, spec, CATALOG)
    assert out.error is None and out.violations == () and out.ok, (out.error, out.violations[:3])
    assert out.version == "0.33.0" and not out.unmet
    assert out.stats.finished == spec.expect["finished_reqs"]
    assert out.stats.cached_tokens and out.stats.evicted_tokens


@pytest.mark.parametrize(
    ("kind", "spec", "caught"),
    [
        ("skip_free", "radix-eviction", {"census.no_orphans", "vllm.free_queue_iff_unreferenced"}),
        ("double_free", "radix-eviction", {"pool.busy_sum"}),
        (
            "unpinned_hit",
            "chunked-prefill-paged",
            {"census.no_dangling", "vllm.ref_cnt_is_holders"},
        ),
        ("early_window_free", "swa-hybrid", {"vllm.window_blocks_held"}),
        ("spec_unreserved", "eagle-v1-paged", {"vllm.table_covers_computed"}),
    ],
)
def test_a_planted_fault_is_caught_naming_the_block(kind: str, spec: str, caught: set[str]) -> None:
    """The fault fires on one block (or, unreserved drafts, on requests); the first
    violations name it (the census by id, or vLLM's own rules)."""
    step = {"unpinned_hit": 1, "early_window_free": 20}.get(kind, 5)
    spec_file = load_spec(ROOT / "specs" / f"{spec}.yaml", {"test_retract": False})
    out = run_spec(VLLM, spec_file, CATALOG, fault={"kind": kind, "step": step})
    fired = ast.literal_eval(
        next(n for n in out.notes if n.startswith("fault fired")).split("blocks ")[1]
    )
    assert fired, out.notes
    assert caught <= {v.invariant for v in out.violations}, out.violations[:3]
    if kind != "double_free":  # a relinked node: vLLM's counter, not the walk, shows it
        named = [v for v in out.violations if v.invariant in caught]
        assert any(str(one) in str(v) for one in fired for v in named), (fired, named[:2])


@pytest.mark.parametrize(("overlap", "scheduler"), [("on", "AsyncScheduler"), ("off", "Scheduler")])
def test_overlap_is_vllms_async_scheduling(overlap: str, scheduler: str) -> None:
    """kvspec's overlap scheduler is vLLM's async scheduling: with overlap the AsyncScheduler
    runs (one step always in flight, its output processed after the next is scheduled),
    without it the Scheduler; aborts and preemption under pressure are clean on both."""
    from invariants.scenarios.spec import parse_overrides

    path = ROOT / "specs" / "aborts-and-preemption.yaml"
    spec = load_spec(path, parse_overrides([f"overlap={overlap}"]))
    out = run_spec(VLLM, spec, CATALOG)
    assert out.ok, (out.error, out.violations[:3])
    assert f"scheduler: {scheduler}" in out.notes and out.stats.aborted


def test_specs_vllm_cannot_express_are_said_unsupported() -> None:
    """Sessions, forced retracts, speculation under async scheduling: the reason, no run,
    no pass."""
    out = run_spec(VLLM, load_spec(ROOT / "specs" / "streaming-sessions.yaml"), CATALOG)
    assert not out.ok and any("sessions" in why for why in out.unsupported)


def test_the_explorer_runs_seeds_and_a_failing_trace_replays(tmp_path) -> None:
    """`kvspec explore --target vllm`: seeds of drawn configurations (SWA groups among them)
    run clean on 0.33.0, and a seed's trace replays to the same verdict."""
    from invariants.targets.explore import RealTarget
    from invariants.targets.replay import replay_on
    from invariants.targets.streamed import explore_real
    from invariants.targets.vllm.adapter import swarm

    explored = RealTarget("vllm")
    report = explore_real(explored, 6, 120, out_dir=tmp_path)
    assert report.version == "0.33.0"
    assert len(report.results) == 6 and not report.failed, report.failed[:2]
    assert any(swarm(s.seed).engine.swa_tokens for s in report.results)
    assert all(r.iterations > 0 for r in report.results)
    replayed = replay_on("vllm", explored.trace(2, 120))
    assert replayed.failure is None and "no finding" in replayed.describe()[0]


def test_the_report_shows_kvspec_and_vllm_side_by_side(tmp_path) -> None:
    """`kvspec report --target vllm`: every spec as written on both; the ones vLLM runs are
    clean with their steps, the others named unsupported with the reason, not failed."""
    import json

    from rich.console import Console

    from invariants.report.run import run_report

    console = Console(record=True, width=250)
    assert run_report(console=console, out=tmp_path, target="vllm") == 0
    printed = console.export_text()
    assert "kvspec and vLLM 0.33.0 (real v1 scheduler) side by side" in printed
    document = json.loads((tmp_path / "report.json").read_text())
    rows = {p["spec"]: p["row"] for p in document["targets"]["vllm"]["side_by_side"]}
    ran = {name for name, row in rows.items() if not row["unsupported"]}
    assert {"radix-eviction", "aborts-and-preemption", "chunked-prefill-paged"} <= ran
    assert all(rows[n]["num_violations"] == 0 and rows[n]["error"] is None for n in ran)
    assert "swa-hybrid" in ran and "sessions" in rows["streaming-sessions"]["unsupported"]


def test_the_null_block_ref_cnt_finding_reproduces_on_0_30_and_not_on_0_33() -> None:
    """`kvspec explore --target vllm` on 0.30.0, shrunk to one request under a sliding-window
    group: at idle the null block's ref_cnt is -1 (0.30.0's ``BlockPool.free_blocks``
    decrements it for every null entry a freed table holds, and nothing increments it);
    0.33.0 skips the null block there, and the same trace is clean."""
    from invariants.scenarios.ops import Trace
    from invariants.targets.replay import replay_on

    trace = Trace.load(Path(__file__).parent / "traces" / "null-block-ref-cnt.json")
    assert replay_on("vllm", trace).failure is None
    old = ROOT / ".vllm-venv-0.30.0" / "bin" / "python"
    if not old.exists():
        pytest.skip("no .vllm-venv-0.30.0: make vllm-env VLLM_VERSION=0.30.0")
    replayed = replay_on("vllm", trace, TargetOptions(python=str(old)))
    assert replayed.failure == "vllm.idle_empty"
    assert "held at idle: [[0, -1, 0]]" in str(replayed.outcome.violations[0])


@pytest.mark.parametrize(("eos_prob", "sampled"), [(0.0, 4 * 10), (1.0, 4 * 4)])
def test_eos_ends_a_request_after_its_minimum(eos_prob: float, sampled: int) -> None:
    """With EOS drawn wherever it may be, four requests that honour EOS with
    ``min_new_tokens: 3`` sample three other tokens (the runner masks EOS before the minimum,
    as vLLM's sampler does), then EOS ends each: four tokens; without EOS each samples its
    ten. Clean either way."""
    from invariants.scenarios.ops import Submit, Trace
    from invariants.scenarios.spec import EngineSpec

    ops = [
        Submit(
            rid=f"r{i}",
            input_ids=list(range(1, 30)),
            max_new_tokens=10,
            ignore_eos=False,
            min_new_tokens=3,
        )
        for i in range(4)
    ]
    engine = EngineSpec(eos_prob=eos_prob, enable_overlap=False, page_size=4)
    out = run_trace(VLLM, Trace(name="eos", seed=0, engine=engine, ops=ops), CATALOG, 2)
    assert out.ok and out.stats.finished == 4, (out.error, out.violations[:2])
    assert out.stats.decode_tokens == sampled


def test_the_replay_bench_times_the_driver_alone_with_views_off_and_on() -> None:
    """``kvspec bench target --replay``: one checked run's ops replayed inside the driver with
    views off and on in turn, ending as the run did; viewing costs the driver CPU time."""
    spec = str(ROOT / "specs" / "vllm" / "chunked-local.yaml")
    replay = bench_target("vllm", (spec,), runs=1, replay=True)["rows"][0]["replay"]
    assert 0 < replay["unviewed_cpu_s"] < replay["viewed_cpu_s"]
    assert replay["cpu_ratio"] > 1
