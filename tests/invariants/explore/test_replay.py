"""Replay (invariants/explore/replay.py, `kvspec replay`): the state-view diff is keyed by
identity and bounded; a clean trace replays with exit 0, a failing one with exit 1 and the
violation first, an unreadable file with exit 2 and the reason."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from engine.view import PoolView, ReqView, StateView
from invariants.cli import app
from invariants.explore import replay, view_diff
from invariants.scenarios.ops import Idle, Step, Submit, Trace
from invariants.scenarios.spec import EngineSpec

BEFORE = StateView(
    step=4,
    pools=(PoolView(name="full", capacity=64, free=40, request_owned=24),),
    reqs=(
        ReqView(rid="a", req_pool_idx=1, kv_committed_len=8, kv_allocated_len=8),
        ReqView(rid="b", req_pool_idx=2, kv_committed_len=16, kv_allocated_len=16),
    ),
)
AFTER = StateView(
    step=5,
    pools=(PoolView(name="full", capacity=64, free=48, request_owned=16),),
    reqs=(
        ReqView(rid="b", req_pool_idx=2, kv_committed_len=17, kv_allocated_len=17),
        ReqView(rid="c", req_pool_idx=1, kv_committed_len=3, kv_allocated_len=3),
    ),
)


def test_diff_is_keyed_by_identity() -> None:
    """Fields change in place under their record's key; a request that went or came is
    one line (not one per field, and not a shifted list position)."""
    diff = view_diff(BEFORE, AFTER)
    assert "  pools[full].free: 40 -> 48" in diff and "  reqs[b].kv_committed_len: 16 -> 17" in diff
    assert "  step: 4 -> 5" in diff
    assert sum(line.startswith("- reqs[a]") for line in diff) == 1
    assert sum(line.startswith("+ reqs[c]") for line in diff) == 1
    assert not any("reqs[b].rid" in line or "reqs[c]." in line for line in diff)


def test_diff_is_bounded() -> None:
    """At most ``limit`` lines, then one line saying how many more."""
    diff = view_diff(BEFORE, AFTER, limit=3)
    assert len(diff) == 4 and diff[-1].startswith("  ... ")
    assert view_diff(BEFORE, BEFORE) == []


def trace_file(tmp_path: Path, ops: list) -> Path:
    path = tmp_path / "t.json"
    Trace(name="r", seed=2, engine=EngineSpec(max_total_tokens=512, context_len=256), ops=ops).save(
        path
    )
    return path


def test_replay_of_a_clean_trace(tmp_path: Path) -> None:
    """No violation: exit 0 and the run's size."""
    path = trace_file(tmp_path, [Submit(rid="a", input_ids=[1, 2, 3], max_new_tokens=4), Step(n=2)])
    result = CliRunner().invoke(app, ["replay", str(path)])
    assert result.exit_code == 0 and "no violation" in result.output


def test_replay_reports_a_liveness_failure(tmp_path: Path) -> None:
    """A drain op that runs out of steps is reproduced as a liveness failure (exit 1)."""
    path = trace_file(
        tmp_path, [Submit(rid="a", input_ids=[1, 2, 3], max_new_tokens=40), Idle(max_steps=2)]
    )
    assert replay(Trace.load(path)).failure == "liveness"
    result = CliRunner().invoke(app, ["replay", str(path)])
    assert result.exit_code == 1 and "failure: liveness" in result.output


def test_replay_of_an_unreadable_file(tmp_path: Path) -> None:
    """A file that is not a trace: exit 2, naming the file and the field."""
    path = tmp_path / "bad.json"
    path.write_text('{"version": 1, "ops": [{"op": "step", "n": 0}]}')
    result = CliRunner().invoke(app, ["replay", str(path)])
    assert result.exit_code == 2 and "bad.json" in result.output and "ops.0" in result.output
