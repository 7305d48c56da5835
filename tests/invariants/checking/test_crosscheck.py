"""Cross-check mode (``KVSPEC_CROSSCHECK=1``): every fast path — the incremental census, the
reused request views, the registry's node views and owners, the checker's fused test — runs
beside its from-scratch evaluation at every event, and the first disagreement stops the run
naming both answers. A representative slice of the shipped specs and an explorer campaign
run clean with it on; a fast path made to lie is caught in each of the four places."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.observe import memory_view
from engine.observe.crosscheck import ENV, CrossCheckMismatch, cross_check
from engine.observe.req_views import ReqPlaces, ReqViewCache
from engine.request import Req
from engine.view import Census, PageOwners, ReqView
from invariants.checking.fastpath import EventFastPath
from invariants.checking.loader import load_text, shipped_catalog
from invariants.explore import explore
from invariants.scenarios.runner import run_spec
from invariants.scenarios.spec import load_spec

SPECS = Path(__file__).resolve().parents[3] / "specs"
SLICE = (  # sessions, SWA, spec v2 with retract at page 16, mixed chunk, chunked prefill
    "streaming-sessions.yaml",
    "swa-hybrid.yaml",
    "eagle-v2-large-page-retract.yaml",
    "retract-mixed-chunk.yaml",
    "chunked-prefill-paged.yaml",
)


@pytest.fixture
def crosscheck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "1")


@pytest.mark.parametrize("name", SLICE)
def test_the_shipped_specs_agree_with_their_from_scratch_evaluation(
    name: str, crosscheck: None
) -> None:
    """Every event of these specs: fast census == scratch census, reused views == fresh
    views, kept node views and owners == a walk of the tree, fused pass == each rule's pass."""
    outcome = run_spec(load_spec(SPECS / name), shipped_catalog())
    assert outcome.ok, outcome.violations[:3]
    assert outcome.checks > 0


def test_an_explorer_campaign_agrees_with_its_from_scratch_evaluation(
    crosscheck: None, tmp_path: Path
) -> None:
    """Generated and mutated runs (swarm pools, page sizes, sessions, spec) under cross-check."""
    report = explore(6, 60, out_dir=tmp_path)
    assert not report.failed


def test_a_mismatch_names_the_first_differing_item() -> None:
    """Two tuples of one length: the first differing index and both values are named."""
    with pytest.raises(CrossCheckMismatch) as caught:
        cross_check("request views", (1, 2, 3), (1, 5, 3))
    assert caught.value.what == "request views[1]"
    assert "fast path:    2" in str(caught.value) and "from scratch: 5" in str(caught.value)
    cross_check("equal", (1, 2), (1, 2))  # no mismatch, no error


def test_a_lying_incremental_census_is_caught(
    crosscheck: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An incremental census that invents a duplicate differs from the scratch census."""
    real = memory_view.incremental_census

    def lying(*args: object) -> Census:
        census = real(*args)
        return Census(census.num_pages, duplicates=(PageOwners(7, ("tree:n1", "tree:n2")),))

    monkeypatch.setattr(memory_view, "incremental_census", lying)
    with pytest.raises(CrossCheckMismatch, match="census of the full pool"):
        run_spec(load_spec(SPECS / "radix-eviction.yaml"), shipped_catalog())


def test_stale_request_views_are_caught(crosscheck: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Views reused after their request changed (the cache never rebuilds) differ from fresh."""
    real_init = memory_view.ViewMemo.__init__

    def init(self: memory_view.ViewMemo, spec_state: object = None) -> None:
        real_init(self, spec_state)
        self.req_views = StaleViews(spec_state)

    monkeypatch.setattr(memory_view.ViewMemo, "__init__", init)
    with pytest.raises(CrossCheckMismatch, match=r"request views\[\d+\]"):
        run_spec(load_spec(SPECS / "radix-eviction.yaml"), shipped_catalog())


class StaleViews(ReqViewCache):
    """Hands out, per number of requests, the first views it built: never rebuilt."""

    __slots__ = ("first",)

    def __init__(self, spec_state: object = None) -> None:
        super().__init__(spec_state)
        self.first: dict[int, tuple[ReqView, ...]] = {}

    def views(self, reqs: list[Req], places: ReqPlaces) -> tuple[ReqView, ...]:
        return self.first.setdefault(len(reqs), super().views(reqs, places))


def test_a_fused_test_that_passes_a_failing_rule_is_caught(
    crosscheck: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fused test answering "all pass" where a rule fails is named with the rule's own
    failure (the rule here fails on every pool at every step)."""
    failing = load_text("""
version: 1
invariants:
  - {id: test.never, title: never holds, when: [step], for_each: pools as p,
     expr: p.capacity < 0, message: "{p.name}",
     fixtures: {pass: {event: step, view: {}}, fail: {event: step, view: {pools: [{}]}}}}
""")
    assert not run_spec(load_spec(SPECS / "radix-eviction.yaml"), failing).ok  # slow: found
    monkeypatch.setattr(EventFastPath, "all_pass", lambda self, env: True)
    said = r"(?s)test.never at step, step 1 differs.*passes \(fused test\).*fails: full"
    with pytest.raises(CrossCheckMismatch, match=said):
        run_spec(load_spec(SPECS / "radix-eviction.yaml"), failing)
