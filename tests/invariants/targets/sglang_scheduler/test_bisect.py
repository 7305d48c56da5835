"""Bisecting a finding over releases or commits, without SGLang: the search itself on a fake
runner (each candidate's failure key given), and how a commit range is listed from a clone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from invariants.targets.driver import TargetUnavailable
from invariants.targets.sglang_scheduler.bisect import bisect, commit_candidates
from invariants.targets.sglang_scheduler.venvs import BuildError

LEAK = "census.no_orphans"
RELEASES = ["0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16"]


def runner(keys: dict[str, str | None], tried: list[str] | None = None):
    """A fake run: each candidate's key; a candidate mapped to an exception raises it."""

    def run(candidate: str) -> tuple[str, str | None]:
        if tried is not None:
            tried.append(candidate)
        found = keys[candidate]
        if isinstance(found, Exception):
            raise found
        return candidate, found

    return run


def test_names_the_release_that_introduced_a_finding_in_log_steps():
    """Clean up to 0.5.13, failing from 0.5.14: the answer is 0.5.14, after the two ends
    and at most ceil(log2(n)) steps between them."""
    keys = {v: (LEAK if v >= "0.5.14" else None) for v in RELEASES}
    tried: list[str] = []
    result = bisect(RELEASES, runner(keys, tried), "t.json")
    assert (result.first, result.last_other, result.change) == ("0.5.14", "0.5.13", "introduced")
    assert result.key == LEAK and tried[:2] == ["0.5.10", "0.5.16"] and len(tried) <= 2 + 3
    assert result.conclusion() == f"{LEAK} introduced in 0.5.14 (last without the change: 0.5.13)"


def test_names_the_release_that_fixed_a_finding():
    """Failing up to 0.5.10 and clean from 0.5.11 (the #22862 shape): fixed in 0.5.11."""
    keys = {v: (LEAK if v == "0.5.10" else None) for v in RELEASES}
    result = bisect(RELEASES, runner(keys), "t.json")
    assert (result.first, result.change) == ("0.5.11", "fixed")


def test_a_release_that_cannot_run_or_fails_otherwise_is_skipped():
    """A venv that does not build and a release failing with another key tell nothing:
    their neighbours are tried and the answer is still exact."""
    keys: dict = {v: (LEAK if v >= "0.5.15" else None) for v in RELEASES}
    keys["0.5.13"] = BuildError("sglang 0.5.13: pip failed")
    keys["0.5.12"] = "error:KeyError"
    result = bisect(RELEASES, runner(keys), "t.json")
    assert result.first == "0.5.15" and result.last_other == "0.5.14"
    verdicts = {s.label: s.verdict for s in result.steps}
    assert verdicts["0.5.13"] == "skip" and verdicts["0.5.12"] == "skip"


def test_skips_around_the_change_leave_it_unanswered():
    """When every candidate between the last clean and the first failing one is skipped,
    the bisection says so instead of guessing."""
    keys: dict = {v: (LEAK if v >= "0.5.14" else None) for v in RELEASES}
    keys["0.5.12"] = keys["0.5.13"] = TargetUnavailable("adapter drift")
    keys["0.5.11"] = None
    result = bisect(["0.5.11", "0.5.12", "0.5.13", "0.5.14"], runner(keys), "t.json")
    assert result.first is None
    assert result.conclusion().endswith("hide the change between 0.5.11 and 0.5.14")


@pytest.mark.parametrize(
    ("low", "high", "said"),
    [
        (None, None, "both ends clean"),
        (LEAK, LEAK, f"both ends fail with {LEAK}"),
        (LEAK, "liveness", "the ends fail differently (census.no_orphans / liveness): name"),
    ],
)
def test_ends_that_do_not_differ_by_one_finding_are_refused(low, high, said):
    result = bisect(["a", "b", "c"], runner({"a": low, "b": None, "c": high}), "t.json")
    assert result.first is None and said in result.conclusion()
    assert [s.label for s in result.steps] == ["a", "c"]  # nothing between was run


def test_a_crash_whose_module_moved_is_the_same_finding():
    """0.5.10's session controller is managers/session_controller.py, 0.5.12's is
    session/session_controller.py: the same crash in ``create_req`` at both ends is one
    finding present throughout, not two."""
    old, new = (f"engine.exception@sglang/srt/{m}/session_controller.py:create_req"
                for m in ("managers", "session"))  # fmt: skip
    result = bisect(["a", "b", "c"], runner({"a": old, "b": None, "c": new}), "t.json")
    assert result.first is None and "both ends fail with" in result.conclusion()


def test_the_bad_ends_finding_is_followed_past_the_engines_own_checker():
    """The good end's only failure is SGLang's own checker (its run went on to the end): the
    bad end's crash is the finding, absent there, and its first release is named."""
    crash = "engine.exception@sglang/srt/session/streaming_session.py:take"
    keys = {"a": "sglang:Mem Leak Detected!", "b": "sglang:Mem Leak Detected!", "c": crash}
    result = bisect(["a", "b", "c"], runner(keys), "t.json", bad_last=True)
    assert (result.first, result.change, result.key) == ("c", "introduced", crash)
    result = bisect(["a", "b", "c"], runner(keys), "t.json", finding=crash)
    assert result.first == "c"


def test_an_end_stopped_by_another_finding_first_is_said():
    """The good end stops at another of kvspec's findings before the bad end's could show:
    it tells nothing about the finding, and the answer says to pick an end past it."""
    keys = {"a": LEAK, "b": None, "c": "session.single_live_request"}
    result = bisect(["a", "b", "c"], runner(keys), "t.json", bad_last=True)
    assert "a stops at another finding first (census.no_orphans)" in result.conclusion()


def test_commit_range_lists_the_start_then_every_commit_to_the_end(tmp_path: Path):
    """``A..B`` on a clone: A, then the commits after it up to B, oldest first."""
    repo = tmp_path / "sglang"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=k", "-c", "user.email=k@k"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    made = []
    for n in range(4):
        (repo / "f").write_text(str(n))
        subprocess.run([*git, "add", "f"], check=True)
        subprocess.run([*git, "commit", "-qm", f"c{n}"], check=True)
        head = subprocess.run([*git[:3], "rev-parse", "HEAD"], capture_output=True, text=True)
        made.append(head.stdout.strip())
    listed = commit_candidates(repo, f"{made[0]}..{made[3]}")
    assert len(listed) == 4 and all(made[i].startswith(listed[i]) for i in range(4))
    with pytest.raises(BuildError, match=r"give a range A\.\.B"):
        commit_candidates(repo, made[0])
    with pytest.raises(BuildError, match="git rev-list"):
        commit_candidates(repo, "nope..HEAD")
