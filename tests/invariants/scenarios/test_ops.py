"""The op trace: ops round-trip through JSON, every op is interpreted against the current
state (missing targets are no-ops, reused rids are skipped, rejections are the engine's 400
answers), violations are tied to the op that was running, and an engine crash is returned as
the outcome's error, never raised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.mem.req_to_token import ReqToTokenPool
from invariants.checking.checker import Level
from invariants.checking.loader import load_catalog
from invariants.scenarios.ops import (
    Abort,
    AdvanceClock,
    CloseSession,
    FlushCache,
    ForceRetract,
    Idle,
    OpenSession,
    SessionRef,
    Step,
    Submit,
    Trace,
    TraceError,
    WaitFor,
)
from invariants.scenarios.spec import EngineSpec
from invariants.scenarios.trace_run import run_trace

CATALOG = load_catalog()
ENGINE = EngineSpec(
    enable_streaming_session=True, max_total_tokens=2048, context_len=512, page_size=4
)


def session_trace() -> Trace:
    """Two streaming turns, an abort mid-decode, a rejected offset, a too-long prompt, a close."""
    s = SessionRef(id="s")
    return Trace(
        name="ops",
        seed=3,
        engine=ENGINE,
        ops=[
            OpenSession(sid="s", streaming=True, timeout=5.0),
            Submit(rid="t1", input_ids=list(range(1, 30)), max_new_tokens=6, session=s),
            WaitFor(rids=["t1"]),
            Submit(rid="t2", input_ids=list(range(40, 60)), max_new_tokens=50, session=s),
            Submit(rid="p1", input_ids=list(range(1, 40)), max_new_tokens=20),
            Step(n=4),
            Abort(rid="t2"),
            Submit(
                rid="t3",
                input_ids=[5, 6, 7],
                max_new_tokens=4,
                session=SessionRef(id="s", offset=1),
            ),
            Submit(rid="long", input_ids=[9] * 600, max_new_tokens=4),
            Idle(),
            Submit(rid="t4", input_ids=[8, 9, 10], max_new_tokens=4, session=s),
            WaitFor(rids=["t4"]),
            Submit(rid="p2", input_ids=list(range(1, 30)), max_new_tokens=30),
            Submit(rid="p3", input_ids=list(range(2, 30)), max_new_tokens=30),
            Step(n=3),
            ForceRetract(),
            Abort(phase="running"),
            FlushCache(),
            CloseSession(sid="s"),
            AdvanceClock(seconds=10.0),
        ],
    )


def test_trace_round_trips_through_json(tmp_path: Path) -> None:
    """save then load gives the same trace; every op keeps its kind and fields."""
    trace = session_trace()
    trace.save(tmp_path / "t.json")
    assert Trace.load(tmp_path / "t.json") == trace
    assert json.loads((tmp_path / "t.json").read_text())["ops"][0]["op"] == "open_session"


def test_bad_trace_file_names_file_and_field(tmp_path: Path) -> None:
    """A malformed op is reported with the file and the dotted field path."""
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "ops": [{"op": "submit", "rid": "a", "input_ids": [-1], "max_new_tokens": 1}],
            }
        )
    )
    with pytest.raises(TraceError, match=r"bad\.json: ops\.0\.submit\.input_ids"):
        Trace.load(path)
    path.write_text(json.dumps({"ops": [{"op": "teleport"}]}))
    with pytest.raises(TraceError, match=r"bad\.json: ops\.0"):
        Trace.load(path)


def test_ops_are_interpreted_against_the_current_state() -> None:
    """Rejections are recorded as the engine's answer and the run is clean: the offset turn
    is refused by the streaming session, the 600-token prompt is too long, the aborted turn
    ends with finish type abort and the next turn's prompt is built on the last successful one."""
    out = run_trace(session_trace(), CATALOG, Level.STRICT)
    assert out.ok, out.describe()
    status = {r.index: r.status for r in out.results}
    assert status[7] == "rejected" and status[8] == "rejected" and status[15] == "ok"
    assert out.responses["t2"].finish_type == "abort" and out.responses["t2"].status_code is None
    assert out.responses["long"].status_code == 400
    t1, t4 = out.responses["t1"], out.responses["t4"]
    assert t4.prompt_tokens == t1.prompt_tokens + t1.completion_tokens + 3
    assert t4.cached_tokens > 0  # the mid-abort dropped the slot; the radix tree still has turn 1


def test_missing_targets_are_noops_and_reused_rids_skipped() -> None:
    """Ops whose target is gone do nothing and say so; a reused rid is skipped."""
    trace = Trace(
        engine=ENGINE,
        ops=[
            CloseSession(sid="nope"),
            Abort(rid="nope"),
            Abort(phase="chunked"),
            Submit(rid="a", input_ids=[1, 2], max_new_tokens=2),
            Submit(rid="a", input_ids=[3], max_new_tokens=1),
            WaitFor(rids=["a", "never"]),
            ForceRetract(),
        ],
    )
    out = run_trace(trace, CATALOG)
    assert [r.status for r in out.results] == [
        "noop",
        "noop",
        "noop",
        "ok",
        "skipped",
        "ok",
        "noop",
    ]
    assert out.ok and out.responses["a"].completion_tokens == 2


def test_violation_is_tied_to_its_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row leak is reported at the op during which it happened; stop_at_first ends there."""
    monkeypatch.setattr(ReqToTokenPool, "free", lambda self, row: None)
    trace = Trace(
        engine=ENGINE,
        ops=[
            Submit(rid="a", input_ids=[1, 2, 3], max_new_tokens=2),
            Step(n=1),
            WaitFor(rids=["a"]),
            Step(n=3),
        ],
    )
    out = run_trace(trace, CATALOG, stop_at_first=True)
    first = out.first_violation
    assert first is not None and first.op_index == 2 and out.stopped_at == 2
    assert len(out.violations) == 1 and "op #2" in str(first)
    recorded = run_trace(trace, CATALOG, drain=True)
    assert len(recorded.violations) > 1 and recorded.stopped_at is None


def test_engine_crash_is_the_outcome_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception inside the engine ends the run; the outcome names it and the op."""
    from engine.sched.scheduler import Scheduler

    def boom(self: Scheduler) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(Scheduler, "flush_cache", boom)
    trace = Trace(
        engine=ENGINE, ops=[Submit(rid="a", input_ids=[1], max_new_tokens=1), Idle(), FlushCache()]
    )
    out = run_trace(trace, CATALOG)
    assert out.error is not None and "kaboom" in out.error and "op #2" in out.error
    assert out.stopped_at == 2 and out.error_traceback and not out.ok
