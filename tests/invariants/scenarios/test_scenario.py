"""Scenario specs as op traces: the workload becomes the same ops for the same seed, plain
traffic is drawn exactly as the anchor trace, any subsequence of a spec's trace is a valid
trace (the engine never errors and no invariant fires on it), the spec's own problems are
`path:line` errors, the response oracles fire on a broken engine, and every shipped spec
passes at level 2 with its goals met."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.sched import sessions as session_module
from invariants.checking.checker import Level
from invariants.checking.loader import load_catalog
from invariants.scenarios.matrix import ROOT, default_spec_paths
from invariants.scenarios.ops import Submit
from invariants.scenarios.runner import run_spec
from invariants.scenarios.scenario import BAD_PARAM, TOO_LONG, build_trace
from invariants.scenarios.spec import SpecError, load_spec
from invariants.scenarios.trace_run import run_trace
from invariants.scenarios.workload import TraceShape, make_trace

CATALOG = load_catalog()
SPECS = ROOT / "specs"
SESSION_SPECS = ["session-control", "streaming-aborts", "session-timeouts", "abort-storm"]
TRACES = {name: build_trace(load_spec(SPECS / f"{name}.yaml")) for name in SESSION_SPECS}


def test_trace_is_a_pure_function_of_the_spec() -> None:
    """The same spec gives the same ops; another seed gives other ops."""
    spec = load_spec(SPECS / "streaming-sessions.yaml")
    assert build_trace(spec) == build_trace(spec)
    assert build_trace(spec.model_copy(update={"seed": 99})).ops != build_trace(spec).ops


def test_plain_traffic_is_the_anchor_trace() -> None:
    """A plain-only spec submits exactly make_trace's requests (old specs run the same trace)."""
    spec = load_spec(SPECS / "radix-eviction.yaml")
    w = spec.workload
    assert w.suffix.uniform is not None and w.gen.uniform is not None
    shape = TraceShape(
        256, w.system_prompts, w.system_prompt_len, *w.suffix.uniform, *w.gen.uniform
    )
    submits = [op for op in build_trace(spec).ops if isinstance(op, Submit)]
    assert [(s.rid, tuple(s.input_ids), s.max_new_tokens) for s in submits] == [
        (r.rid, r.input_ids, r.max_new_tokens) for r in make_trace(spec.seed, w.requests, shape)
    ]


def test_workload_generates_every_fault_it_names() -> None:
    """Too-long and rejected-parameter turns are marked in their rid; aborts, closes in
    flight, storms, clock jumps and flushes appear as ops."""
    kinds = {op.op for t in TRACES.values() for op in t.ops}
    assert {
        "abort",
        "close_session",
        "advance_clock",
        "flush_cache",
        "wait_for",
        "open_session",
    } <= kinds
    rids = [op.rid for t in TRACES.values() for op in t.ops if isinstance(op, Submit)]
    assert any(TOO_LONG in r for r in rids) and any(BAD_PARAM in r for r in rids)
    storm = TRACES["abort-storm"].ops
    assert any(op.op == "abort" and op.rid is None for op in storm)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(SESSION_SPECS), data=st.data())
def test_any_subsequence_of_a_spec_trace_is_valid(name: str, data: st.DataObject) -> None:
    """Deleting any ops from a spec's trace leaves a trace the engine runs without an error
    and without a violation (ops are intents interpreted against the current state)."""
    trace = TRACES[name]
    keep = data.draw(st.lists(st.booleans(), min_size=len(trace.ops), max_size=len(trace.ops)))
    sub = trace.with_ops([op for op, k in zip(trace.ops, keep) if k])
    out = run_trace(sub, CATALOG, Level.RECORD)
    assert out.error is None, out.error
    assert not out.violations, out.describe()


def _spec_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        (
            "version: 1\nname: s\ninvariants:\n  - pool.*\n  - no.such.rule\n",
            r"s\.yaml:3: invariants\.1: 'no\.such\.rule'",
        ),
        (
            "version: 1\nname: s\nmatrix:\n  colour: [red]\n",
            r"s\.yaml:4: matrix\.colour: unknown axis",
        ),
        (
            "version: 1\nname: s\nmatrix: {page_size: [3]}\n",
            r"s\.yaml:3: matrix\.page_size: \[3\] not among",
        ),
        (
            "version: 1\nname: s\nworkload:\n  sessions:\n    streaming: 2\n",
            r"s\.yaml:5: workload\.sessions\.streaming: needs engine\.enable_streaming_session",
        ),
        ("version: 1\nname: s\nworkload:\n  gen: [9, 2]\n", r"s\.yaml:4: workload\.gen"),
        (
            "version: 1\nname: s\nworkload:\n  faults: {timeout: 0.5}\n",
            r"s\.yaml:4: workload\.faults\.timeout",
        ),
    ],
)
def test_spec_problems_name_file_line_and_field(tmp_path: Path, text: str, pattern: str) -> None:
    """Unknown invariants, axes and values, sessions the engine cannot open, a bad range and
    a fault without what it needs are load errors with path:line: field."""
    with pytest.raises(SpecError, match=pattern):
        load_spec(_spec_file(tmp_path, text))


def test_invariant_globs_select_the_checked_rules() -> None:
    """`invariants:` ids or globs narrow the checker to the matching rules."""
    spec = load_spec(SPECS / "session-control.yaml").model_copy(
        update={"invariants": ["response.*"]}
    )
    out = run_spec(spec, CATALOG)
    assert (
        out.ok
        and 0 < out.checks < run_spec(load_spec(SPECS / "session-control.yaml"), CATALOG).checks
    )


def test_session_prompt_oracle_fires_on_a_history_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session controller that drops the parent's last token breaks the prompt oracle."""
    real = session_module._prompt
    monkeypatch.setattr(
        session_module,
        "_prompt",
        lambda parent, params, new: (
            real(parent, params, new)[1:] if parent is not None else real(parent, params, new)
        ),
    )
    out = run_spec(
        load_spec(SPECS / "session-control.yaml").model_copy(update={"invariants": ["pool.*"]}),
        CATALOG,
    )
    assert any(f.startswith("oracle session_prompts:") for f in out.oracle_failures), out.unmet


def test_rejection_oracle_fires_when_a_bad_turn_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A streaming session that accepts an offset (SGLang rejects it: 400) breaks the oracle."""
    monkeypatch.setattr(
        session_module.Session,
        "_streaming_parent",
        lambda self, params: (next(iter(self.req_nodes.values()), None), None),
    )
    spec = load_spec(SPECS / "streaming-aborts.yaml").model_copy(update={"invariants": ["pool.*"]})
    out = run_spec(spec, CATALOG)
    assert any(f.startswith("oracle rejections:") for f in out.oracle_failures), out.unmet


@pytest.mark.parametrize("path", default_spec_paths(), ids=lambda p: p.stem)
def test_every_shipped_spec_passes_strict(path: Path) -> None:
    """Each spec as written runs clean at level 2 and meets its goals and oracles."""
    out = run_spec(load_spec(path), CATALOG, Level.STRICT)
    assert out.ok, (out.unmet, out.error, [str(v) for v in out.violations])
