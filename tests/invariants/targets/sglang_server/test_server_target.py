"""SGLang 0.5.23's real HTTP server under the catalog (`make test-sglang`): a streaming-session
spec over real HTTP runs clean at level 2 — every iteration checked inside the scheduler
process, every answer checked against the uncached reference — and the replace-without-rid
crash (`session_controller.py:245`, every release) is a finding: SGLang's traceback, the
server gone, nothing of it left running; its reproducer, run without kvspec's gate, observes
it too."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from invariants.checking.loader import shipped_catalog
from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import load_spec
from invariants.targets.driver import TargetUnavailable
from invariants.targets.explore import failure_key
from invariants.targets.registry import target
from invariants.targets.run import run_spec, run_trace
from invariants.targets.sglang_scheduler.releases import installed_versions
from invariants.targets.sglang_server.adapter import ServerDriver
from invariants.targets.sglang_server.repro import reproduce
from invariants.targets.sglang_server.session_tests import run_session_tests

pytestmark = pytest.mark.sglang
SERVER = target("sglang-server")
ROOT = Path(__file__).resolve().parents[4]
REPLACE = ROOT / "tests/invariants/targets/sglang_scheduler/traces/session-replace-all-crash.json"
CRASH_SITE = "sglang/srt/session/session_controller.py:create_req"


@pytest.fixture(scope="module")
def server():
    if "0.5.23" not in installed_versions():
        pytest.skip("sglang 0.5.23: make sglang-env")
    with ServerDriver("0.5.23") as driver:
        yield driver


def stopped(driver: ServerDriver) -> bool:
    """The trace's server is gone: nothing listens on its port any more."""
    port = int(driver.command[driver.command.index("--port") + 1])
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_streaming_sessions_over_http_run_clean(server):
    """session-control's 30 requests (streaming and plain sessions, aborts, closes) over
    real HTTP: no violation, no finding of SGLang's checkers; every answer that carries
    counts is a response view, and each plain request's tokens are the reference's."""
    outcome = run_spec(SERVER, load_spec(ROOT / "specs/session-control.yaml"), shipped_catalog(),
                       driver=server, keep_views=True)  # fmt: skip
    assert outcome.ok, (outcome.violations[:3], outcome.findings[:3], outcome.error)
    assert outcome.stats.finished == outcome.stats.submitted == 30
    responses = [v.response for v in outcome.views if v.event == "response"]
    assert len(responses) >= 20
    checked = [r for r in responses if r.reference_checked]
    assert checked and all(r.output_ids == r.reference_ids for r in checked)
    assert any(r.turn > 1 and r.cached_tokens > 0 for r in responses)  # a turn inherited KV
    assert stopped(server)


def test_replace_without_rid_takes_the_server_down(server):
    """A non-streaming session, a turn, then `replace: true` without a rid: SGLang's
    `create_req` deletes from `req_nodes` while iterating it; the scheduler process dies with
    SGLang's own traceback (the catalog's crash event), and the server is stopped."""
    outcome = run_trace(SERVER, Trace.load(REPLACE), shipped_catalog(), driver=server)
    assert failure_key(outcome) == f"engine.exception@{CRASH_SITE}"
    assert outcome.crash is not None and "dictionary changed size" in outcome.crash.message
    assert stopped(server)


def test_the_reproducer_observes_it_without_kvspec(tmp_path):
    """`kvspec sglang repro`: the script alone, against a server with no gate, sees the
    server go down; the issue text names the mechanism's line."""
    if "0.5.23" not in installed_versions():
        pytest.skip("sglang 0.5.23: make sglang-env")
    done = reproduce(Trace.load(REPLACE), "0.5.23", tmp_path, tries=3, history=False)
    assert done.validated, done.said
    issue = (tmp_path / "ISSUE.md").read_text()
    assert (
        "session_controller.py:245" in issue
        and "for _, req_node in self.req_nodes.items()" in issue
    )
    assert (tmp_path / "launch.sh").exists() and (tmp_path / "repro.py").exists()


def test_a_port_in_use_is_one_line(monkeypatch):
    """A port someone holds is a set-up problem (exit 2 on the command line), said in one
    line, before any server starts."""
    if "0.5.23" not in installed_versions():
        pytest.skip("sglang 0.5.23: make sglang-env")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        monkeypatch.setenv("KVSPEC_SERVER_PORT", str(held.getsockname()[1]))
        with pytest.raises(TargetUnavailable, match="is in use"):
            run_trace(SERVER, Trace.load(REPLACE), shipped_catalog())


def test_sglangs_own_streaming_session_tests_pass_on_cpu():
    """The release's own streaming-session tests (its sglang/test kits, composed as its
    test_streaming_session.py composes them), only the server launch kvspec's: each passes,
    but the one that needs logprobs, which is named not applicable with the reason."""
    if "0.5.23" not in installed_versions():
        pytest.skip("sglang 0.5.23: make sglang-env")
    results = run_session_tests("0.5.23", [])
    outcomes = {r["test"]: r["outcome"] for r in results}
    assert outcomes.pop("test_leak_logprob_concurrent") == "not applicable"
    assert set(outcomes.values()) == {"passed"}, [r for r in results if r["outcome"] == "failed"]
    assert {"test_kv_cache_inheritance", "test_abort_heavy_chunked_prefill_does_not_leak"} <= set(
        outcomes
    )
