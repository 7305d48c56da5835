"""Releases side by side, without SGLang: each finding's span over the releases run — where
it was first and last seen, and where it was not."""

from __future__ import annotations

from invariants.targets.sglang_scheduler.history import (
    HistoryRow,
    ReleaseHistory,
    finding_spans,
    history_json,
)


def row(release: str, invariant: str, kind: str = "census") -> HistoryRow:
    return HistoryRow(release, "spec", kind, invariant, 3, (), "kvspec run ...", "")


def test_a_finding_spans_the_releases_that_showed_it_oldest_first():
    """A leak seen on 0.5.10 and 0.5.10.post1 and a crash from 0.5.22: each with its first
    and last release and the releases run clean of it; a release that did not run (its
    adapter drifted) is neither."""
    histories = [
        ReleaseHistory("0.5.10", rows=[row("0.5.10", "census.no_orphans")]),
        ReleaseHistory("0.5.10.post1", rows=[row("0.5.10.post1", "census.no_orphans")]),
        ReleaseHistory("0.5.11"),
        ReleaseHistory("0.5.21", error="adapter drift: ..."),
        ReleaseHistory("0.5.22", rows=[row("0.5.22", "engine.exception@x", "crash")]),
        ReleaseHistory("0.5.23", rows=[row("0.5.23", "engine.exception@x", "crash")]),
    ]
    leak, crash = finding_spans(histories)
    assert (leak.invariant, leak.first, leak.last) == (
        "census.no_orphans",
        "0.5.10",
        "0.5.10.post1",
    )
    assert leak.clean == ("0.5.11", "0.5.22", "0.5.23")
    assert (crash.kind, crash.first, crash.last) == ("crash", "0.5.22", "0.5.23")
    assert "0.5.21" not in crash.releases + crash.clean
    spans = history_json(histories)["findings"]
    assert spans[0]["first"] == "0.5.10" and tuple(spans[1]["releases"]) == ("0.5.22", "0.5.23")
