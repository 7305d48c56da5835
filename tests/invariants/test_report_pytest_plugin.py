"""The pytest plugin (invariants/pytest_plugin.py) seen from a user's test suite, run with
pytest's own `pytester`: a marked spec passes on the correct engine and fails — naming the
invariant and the replay command — on a broken one; `checked_engine` raises at the first
violation (level 2); and the report's junit.xml speaks the JUnit dialect pytest writes."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from invariants.checking.checker import Level
from invariants.report.files import junit_xml
from invariants.report.model import CellResult, ReportHeader

pytest_plugins = ["pytester"]
PLUGIN = ("-p", "invariants.pytest_plugin")  # also fine when the entry point loaded it already

TINY_SPEC = """version: 1
name: tiny
seed: 3
engine: {page_size: 4, max_total_tokens: 2048, max_num_reqs: 8}
workload: {requests: 6}
expect: {finished_reqs: 6}
"""

LEAK = """
import pytest
from engine.mem.req_to_token import ReqToTokenPool

@pytest.fixture
def leak(monkeypatch):
    monkeypatch.setattr(ReqToTokenPool, "free", lambda self, row: None)  # rows never come back
"""


def test_marked_spec_passes_then_fails_on_a_leak(pytester: pytest.Pytester) -> None:
    """`@pytest.mark.kvspec_spec` runs the spec before the test: the clean test passes and sees
    the outcome; the test whose fixture breaks the engine fails with the invariant and replay."""
    pytester.makefile(".yaml", tiny=TINY_SPEC)
    pytester.makeconftest(LEAK)
    pytester.makepyfile(
        test_kvspec_user_spec="""
        import pytest

        @pytest.mark.kvspec_spec("tiny.yaml")
        def test_clean(kvspec_outcome):
            assert kvspec_outcome.stats.finished_reqs == 6 and kvspec_outcome.checks > 0

        @pytest.mark.kvspec_spec("tiny.yaml", page_size=1)
        def test_leaky(leak):
            pass
    """
    )
    result = pytester.runpytest(*PLUGIN, "--strict-markers")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*[[]req_pool.conservation[]]*", "*replay: kvspec run *tiny.yaml --set page_size=1*"]
    )


def test_checked_engine_raises_at_the_first_violation(pytester: pytest.Pytester) -> None:
    """`checked_engine(**engine_fields)` is checked at level 2 (the first violation raises);
    at level 1 its checker records the violations instead."""
    pytester.makeconftest(LEAK)
    pytester.makepyfile(
        test_kvspec_user_engine="""
        import pytest
        from engine.engine import SchedulerStall
        from invariants.checking.checker import InvariantViolation

        PROMPTS = [[1 + i, 2, 3, 4, 5, 6] for i in range(12)]

        def test_clean_engine(checked_engine):
            engine = checked_engine(page_size=4, max_total_tokens=512, max_num_reqs=4)
            assert all(r.completion_tokens > 0 for r in engine.generate(PROMPTS))
            assert checked_engine.checker(engine).violations == []

        def test_leak_raises(checked_engine, leak):
            engine = checked_engine(page_size=4, max_total_tokens=512, max_num_reqs=4)
            with pytest.raises(InvariantViolation, match="req_pool.conservation"):
                engine.generate(PROMPTS)

        def test_leak_recorded_at_level_1(checked_engine, leak):
            engine = checked_engine(level=1, page_size=4, max_total_tokens=512, max_num_reqs=4)
            with pytest.raises(SchedulerStall, match="scheduler stalled"):
                engine.generate(PROMPTS)  # rows run out: the engine stops, after the checker saw it
            assert checked_engine.checker(engine).violations
    """
    )
    pytester.runpytest(*PLUGIN).assert_outcomes(passed=3)


def test_marker_misuse_is_a_clear_failure(pytester: pytest.Pytester) -> None:
    """A missing spec file and an unknown engine field fail the test with the reason."""
    pytester.makefile(".yaml", tiny=TINY_SPEC)
    pytester.makepyfile(
        test_kvspec_user_bad="""
        import pytest

        @pytest.mark.kvspec_spec("missing.yaml")
        def test_missing():
            pass

        @pytest.mark.kvspec_spec("tiny.yaml", page_sze=4)
        def test_typo():
            pass
    """
    )
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*spec missing.yaml not found*", "*page_sze*"])


def _vocabulary(root: ET.Element) -> set[tuple[str, str]]:
    return {(element.tag, attribute) for element in root.iter() for attribute in element.attrib} | {
        (element.tag, "") for element in root.iter()
    }


def test_junit_uses_the_dialect_pytest_writes(pytester: pytest.Pytester) -> None:
    """Every element and attribute of the report's junit.xml also occurs in pytest's own
    --junitxml output (passed, failed and erroring tests, suite properties), or is the JUnit
    schema's `type` of a failure, so consumers of pytest's JUnit files read ours."""
    pytester.makepyfile(
        test_kvspec_user_ref="""
        import pytest

        @pytest.fixture
        def broken():
            raise RuntimeError("setup")

        def test_pass(record_testsuite_property):
            record_testsuite_property("level", "1")

        def test_fail():
            assert False

        def test_error(broken):
            pass
    """
    )
    pytester.runpytest("--junitxml=ref.xml", "-o", "junit_family=xunit2")
    reference = _vocabulary(ET.parse(pytester.path / "ref.xml").getroot())
    cells = [
        CellResult("ok", "spec", "kvspec run ok.yaml", 3, 9, 0, (), (), None, 0.1),
        CellResult(
            "bad",
            "spec",
            "kvspec run bad.yaml",
            3,
            9,
            1,
            ({"invariant": "pool.x", "step": 2, "event": "step", "message": "m"},),
            (),
            None,
            0.1,
        ),
        CellResult("crash", "memory", "kvspec explore memory", 3, 9, 0, (), (), "Boom: x", 0.1),
    ]
    ours = _vocabulary(
        ET.fromstring(junit_xml(ReportHeader.for_run(1, Level.RECORD, False, 1, None), cells))
    )
    assert {tag for tag, _ in ours} >= {"testsuites", "testsuite", "testcase", "failure", "error"}
    # `type` on <failure>/<error> is in the JUnit schema (pytest writes it on <skipped> only)
    schema_extras = {("failure", "type"), ("error", "type")}
    assert ours <= reference | schema_extras, sorted(ours - reference - schema_extras)
