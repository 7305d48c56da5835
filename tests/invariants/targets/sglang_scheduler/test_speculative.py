"""EAGLE speculative decoding on SGLang's real scheduler: a release runs it only where its
driver's banner says so (checked before the trace runs); on 0.5.23 the spec-v2 accounting is
SGLang's own (the fake worker only draws accept lengths and tokens), runs clean in both loops,
and a streaming session's slot claims the KV of a rejected draft (kv.integrity names it)."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from invariants.checking.loader import shipped_catalog
from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import EngineSpec, load_spec
from invariants.targets.outcome import disagreements
from invariants.targets.registry import TargetOptions, target
from invariants.targets.run import run_spec, run_trace
from invariants.targets.sglang_scheduler.adapter import config, release_supports, unsupported_engine
from invariants.targets.sglang_scheduler.releases import (
    SUPPORTS_SEEN,
)

STALE_SLOT = Path(__file__).parent / "traces" / "eagle-session-stale-slot.json"
EAGLE = {"version": 1, "num_steps": 3, "num_draft_tokens": 4, "accept_prob": 0.6}
SCHEDULER = target("sglang-scheduler")


def overlapped(engine: EngineSpec) -> EngineSpec:
    """The same engine under the overlap loop (kvspec calls that EAGLE v2)."""
    spec = {**engine.speculative, "version": 2} if engine.speculative else None
    return engine.model_copy(update={"enable_overlap": True, "speculative": spec})


# ---- without sglang ----


def test_speculative_runs_only_where_the_releases_driver_drives_it(monkeypatch):
    """A trace with a ``speculative`` section is refused, naming the release, once the
    release's driver has said (its banner's ``supports``) it drives no draft worker; before
    any driver has answered for a release nothing is refused yet (the run refuses it right
    after its driver starts, before the trace runs); a plain engine is refused nowhere."""
    eagle, plain = EngineSpec(speculative=EAGLE), EngineSpec()
    monkeypatch.setitem(SUPPORTS_SEEN, "0.5.23", frozenset({"speculative"}))
    monkeypatch.setitem(SUPPORTS_SEEN, "0.5.11", frozenset())
    monkeypatch.delitem(SUPPORTS_SEEN, "9.9.9", raising=False)
    assert "speculative" in (release_supports("0.5.23") or ())
    assert unsupported_engine(eagle, "0.5.23") == [] == unsupported_engine(eagle)
    (reason,) = unsupported_engine(eagle, "0.5.11")
    assert reason.startswith("speculative") and "0.5.11" in reason
    assert unsupported_engine(plain, "0.5.11") == []
    assert release_supports("9.9.9") is None and unsupported_engine(eagle, "9.9.9") == []


BANNER = (
    '{"ready": true, "version": "9.9.9", "adapter": "adapter_legacy", "probes": {}, '
    '"not_applicable": {}, "supports": []}'
)


def test_a_release_that_drives_no_draft_worker_refuses_before_the_trace(tmp_path):
    """A release no driver had answered for: its driver starts, its banner lists no
    ``speculative``, and the trace is refused with the reason before its config is sent."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho '{BANNER}'\nread line\necho '{{}}'\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    trace = Trace(engine=EngineSpec(speculative=EAGLE), ops=[])
    outcome = run_trace(SCHEDULER, trace, shipped_catalog(), options=TargetOptions(str(python)))
    assert outcome.unsupported and outcome.unsupported[0].startswith("speculative")
    assert outcome.stats.steps == 0


def test_the_config_op_carries_the_eagle_section():
    """The driver's config names the chain draft and its seeded acceptance; a plain engine
    sends None."""
    eagle = Trace(engine=EngineSpec(enable_overlap=False, speculative=EAGLE), ops=[])
    assert config(eagle)["speculative"] == {
        "num_steps": 3,
        "num_draft_tokens": 4,
        "accept_prob": 0.6,
    }
    assert config(Trace(engine=EngineSpec(), ops=[]))["speculative"] is None


# ---- on real SGLang 0.5.23 ----


@pytest.mark.sglang
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_eagle_runs_clean_with_sglangs_own_accounting_moving(latest, overlap):
    """eagle-v1-paged (page 4, chunked prefill, SGLang's test retract) on 0.5.23, in the
    normal loop and the overlap loop: no violation, SGLang's checkers silent, drafts accepted
    (an accept length above 1), the spec reservation held past the committed length
    (allocated > committed), requests retracted, and every forward's KV reads checked."""
    spec = load_spec("specs/eagle-v1-paged.yaml")
    if overlap:
        spec = spec.model_copy(update={"engine": overlapped(spec.engine)})
    outcome = run_spec(SCHEDULER, spec, shipped_catalog(), driver=latest, keep_views=True)
    assert outcome.ok, (outcome.violations[:3], outcome.findings[:3], outcome.error)
    steps = [v for v in outcome.views if v.event == "step"]
    rows = [r for v in steps for r in v.reqs if r.spec_seq_len >= 0]
    assert {v.sched.spec_mode for v in steps} == {"v2"}
    assert max(r.spec_accept_len for r in rows) > 1
    assert any(r.kv_allocated_len > r.kv_committed_len for r in rows if r.req_pool_idx >= 0)
    assert outcome.stats.retracted > 0 and outcome.stats.finished == 40
    forwards = [v for v in outcome.views if v.event == "forward"]
    assert len(forwards) == outcome.stats.forwards and not any(v.integrity for v in forwards)


@pytest.mark.sglang
@pytest.mark.parametrize("overlap,iteration", [(False, 6), (True, 7)], ids=["sync", "overlap"])
def test_a_streaming_turn_reuses_a_rejected_drafts_kv(latest, overlap, iteration):
    """0.5.23, streaming_session.py:187: a turn that finishes by length at the end of its
    accepted run leaves its last output token without KV — position prompt + finished_len -
    1 (here 20 + 11 - 1 = 30) holds the KV the verify wrote for the draft it rejected there
    (the fake writes token + 1). ``slot.kv.kv_committed_len = min(target,
    kv_allocated_len)`` commits that position because the spec reservation keeps
    allocated >= target, so the next turn's prefill attends to it: kv.integrity fires at
    that prefill, the first violation, while SGLang's sums are silent."""
    trace = Trace.load(STALE_SLOT)
    if overlap:
        trace = trace.model_copy(update={"engine": overlapped(trace.engine)})
    outcome = run_trace(SCHEDULER, trace, shipped_catalog(), driver=latest)
    first = outcome.violations[0]
    assert (first.invariant, first.event, first.step) == ("kv.integrity", "forward", iteration)
    assert first.message.startswith("req t2 read position 30 from full slot 34")
    expected, found = map(int, re.findall(r"fingerprint (\d+), found (\d+)", first.message)[0])
    assert found == expected + 1_000_000  # the rejected draft's token (true + 1), position 30
    assert not outcome.findings
    assert [d.kind for d in disagreements(outcome, "SGLang")] == ["kvspec-only"]


FIX = """
import inspect, os, runpy, sys, textwrap
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "..", "..", "sglang", "driver"))
import stubs
stubs.install()
from sglang.srt.session import streaming_session as ss
source = textwrap.dedent(inspect.getsource(ss.StreamingSession.try_cache_finished_req))
old = "slot.kv.kv_committed_len = min(target, slot.kv.kv_allocated_len)"
assert old in source
source = source.replace(old, "slot.kv.kv_committed_len = min(target, slot.kv.kv_committed_len)")
names = {}
code = compile("from __future__ import annotations\\n" + source, ss.__file__, "exec")
exec(code, ss.__dict__, names)
ss.StreamingSession.try_cache_finished_req = names["try_cache_finished_req"]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.sglang
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_committing_only_what_the_turn_committed_clears_it(latest, tmp_path, overlap):
    """With line 187 as ``min(target, slot.kv.kv_committed_len)`` (patched into the
    driver's SGLang, nothing else changed) the same trace is clean: the next turn re-prefills
    the one token whose KV the finished turn never wrote."""
    (tmp_path / "fix.py").write_text(FIX)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {latest.python} {tmp_path / "fix.py"} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    trace = Trace.load(STALE_SLOT)
    if overlap:
        trace = trace.model_copy(update={"engine": overlapped(trace.engine)})
    outcome = run_trace(SCHEDULER, trace, shipped_catalog(), options=TargetOptions(str(python)))
    assert outcome.ok, (outcome.violations[:3], outcome.findings[:3], outcome.error)
    assert outcome.stats.finished == 2
