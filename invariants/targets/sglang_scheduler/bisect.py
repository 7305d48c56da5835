"""Where a finding came from: a trace replayed release by release (or commit by commit of an
SGLang git clone), binary search between a release where it holds one way and one where it
holds the other, naming the first release (or commit) of the later state — the one that
introduced the finding, or the one that fixed it.

Keeps: the finding is one failure key (``targets/explore.failure_key``): the one asked for,
else the failing end's (both ends failing: the bad end's); a crash site is compared by file
and function, so a module that moved between releases stays the same finding. A step's
verdict: ``present`` where the trace's key holds every part of the finding, ``absent`` where
it runs clean or only the engine's own checker spoke (the run went on to its end), ``skip``
where another of kvspec's findings stopped it first or it cannot run (a venv that does not
build, an adapter that drifts) — like ``git bisect skip``, a skipped step tells nothing and its
neighbours are tried instead.
Releases are built on demand (``venvs.build_release``); a commit is taken out of the clone with
``git archive`` (the clone itself is never touched) and installed over the nearest release's
venv (``checkout.build_checkout``), like ``git bisect run`` with a build step.
"""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.version import Version

from invariants.checking.loader import shipped_catalog
from invariants.scenarios.ops import Trace
from invariants.targets.driver import TargetUnavailable
from invariants.targets.explore import failure_key
from invariants.targets.registry import target
from invariants.targets.run import run_trace
from invariants.targets.sglang_scheduler.checkout import build_checkout, checkout_version
from invariants.targets.sglang_scheduler.releases import SchedulerDriver, installed_versions
from invariants.targets.sglang_scheduler.venvs import (
    ROOT,
    BuildError,
    build_release,
    index_releases,
    python_of,
)

TARGET = target("sglang-scheduler")
BISECT_VENV = ROOT / ".sglang-venv-bisect"  # the venv each commit is installed into in turn


@dataclass(frozen=True, slots=True)
class Step:
    """One release or commit tried: its label, the version it ran as, what the trace said."""

    label: str
    version: str
    verdict: str  # present | absent | skip
    key: str | None  # the failure key it ran into (None: clean)
    seconds: float
    why: str = ""  # a skip's reason


@dataclass(slots=True)
class Bisection:
    """A whole bisection: the finding's key, the candidates in order, the steps tried."""

    trace: str
    key: str | None = None
    candidates: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    first: str | None = None  # the first candidate in the later endpoint's state
    last_other: str | None = None  # the candidate before it, in the earlier state
    first_seen: str | None = None  # the earliest candidate seen in the later state
    change: str = ""  # "introduced" | "fixed"
    error: str | None = None

    def conclusion(self) -> str:
        """The bisection's answer in one line."""
        if self.error:
            return f"no answer: {self.error}"
        if self.first is None:
            return (
                f"no answer: skipped candidates hide the change between {self.last_other} "
                f"and {self.first_seen}"
            )
        return (
            f"{self.key} {self.change} in {self.first} (last without the change: {self.last_other})"
        )


Runner = Callable[[str], tuple[str, str | None]]  # candidate -> (version ran, failure key)


def bisect(
    candidates: list[str], run: Runner, trace: str, finding: str | None = None, bad_last=None
) -> Bisection:
    """Binary search for the first of ``candidates`` (oldest first) in the state of the last:
    both ends are run first; the finding is ``finding``, else the failing end's key (both
    failing, differently: the bad end's — ``bad_last`` says which end is bad, None: unknown)."""
    result = Bisection(trace, candidates=list(candidates))
    if len(candidates) < 2:
        result.error = "need two candidates (a good and a bad end)"
        return result
    lo, hi = _step(result, run, candidates[0], None), _step(result, run, candidates[-1], None)
    result.error = _ends_error(lo, hi, finding, bad_last)
    if result.error:
        return result
    key = finding or (hi.key if hi.key and (lo.key is None or bad_last) else lo.key)
    assert key is not None  # _ends_error: at least one end failed, or a finding was named
    result.key, result.steps = key, [_judged(s, key) for s in result.steps]
    lo, hi = result.steps
    if {lo.verdict, hi.verdict} != {"present", "absent"}:
        result.error = _undecided(lo, hi, key)
        return result
    result.change = "introduced" if hi.verdict == "present" else "fixed"
    lo_i, hi_i = _search(result, run, 0, len(candidates) - 1)
    result.last_other, result.first_seen = candidates[lo_i], candidates[hi_i]
    if hi_i - lo_i == 1:
        result.first = candidates[hi_i]
    return result


def finding_name(key: str) -> str:
    """A failure key with each crash site cut to its file and function (a module that moved
    between releases is the same finding)."""
    parts = []
    for part in key.split("+"):
        rule, at, site = part.partition("@")
        parts.append(f"{rule}@{site.rsplit('/', 1)[-1]}" if at else part)
    return "+".join(parts)


def same_finding(key: str) -> frozenset[str]:
    """A failure key's parts, as ``finding_name`` cuts them."""
    return frozenset(finding_name(key).split("+"))


def verdict(finding: str | None, found: str | None) -> str:
    """present | absent | skip (see the module docstring)."""
    if found is None:
        return "absent"
    if finding is None or same_finding(finding) <= same_finding(found):
        return "present"
    checker = f"{TARGET.engine.lower()}:"  # a key of the engine's own checker: the run went on
    return "absent" if found.startswith(checker) and not finding.startswith(checker) else "skip"


def _judged(step: Step, finding: str) -> Step:
    """An end's step judged against the finding once it is known."""
    if step.verdict == "skip" and not step.version:  # it could not run at all
        return step
    said = verdict(finding, step.key)
    why = f"fails otherwise: {step.key}" if said == "skip" else ""
    return replace(step, verdict=said, why=why)


def _search(result: Bisection, run: Runner, lo: int, hi: int) -> tuple[int, int]:
    """Narrow ``(lo, hi)`` (states differ) until adjacent or only skips lie between."""
    skipped: set[int] = set()
    while hi - lo > 1:
        mid = _pick(lo, hi, skipped)
        if mid is None:
            break
        step = _step(result, run, result.candidates[mid], result.key)
        if step.verdict == "skip":
            skipped.add(mid)
        elif (step.verdict == "present") == (result.change == "introduced"):
            hi = mid  # already in the later state
        else:
            lo = mid
    return lo, hi


def _pick(lo: int, hi: int, skipped: set[int]) -> int | None:
    """The untried index nearest the middle of ``(lo, hi)``."""
    mid = (lo + hi) // 2
    order = sorted(range(lo + 1, hi), key=lambda i: (abs(i - mid), i))
    return next((i for i in order if i not in skipped), None)


def _step(result: Bisection, run: Runner, label: str, key: str | None) -> Step:
    start = time.perf_counter()
    try:
        version, found = run(label)
    except (TargetUnavailable, BuildError) as exc:
        step = Step(label, "", "skip", None, time.perf_counter() - start, str(exc))
        result.steps.append(step)
        return step
    said = verdict(key, found)
    why = f"fails otherwise: {found}" if said == "skip" else ""
    step = Step(label, version, said, found, time.perf_counter() - start, why)
    result.steps.append(step)
    return step


def _ends_error(lo: Step, hi: Step, finding: str | None, bad_last) -> str | None:
    """Why the two ends leave nothing to bisect (None: they do not)."""
    cannot = [s for s in (lo, hi) if s.verdict == "skip" and not s.version]
    if cannot:
        return f"{cannot[0].label} cannot run: {cannot[0].why}"
    if finding is not None:
        return None
    if lo.key is None and hi.key is None:
        return "both ends clean: nothing to bisect"
    if lo.key and hi.key and same_finding(lo.key) == same_finding(hi.key):
        return f"both ends fail with {hi.key}: nothing to bisect"
    if lo.key and hi.key and bad_last is None:
        return f"the ends fail differently ({lo.key} / {hi.key}): name one with --finding"
    return None


def _undecided(lo: Step, hi: Step, finding: str) -> str:
    """Why ends judged against the finding are not one with and one without it."""
    masked = next((s for s in (lo, hi) if s.verdict == "skip"), None)
    if masked is not None:
        return f"{masked.label} stops at another finding first ({masked.key}): pick an end past it"
    said = "have" if lo.verdict == "present" else "lack"
    return f"both ends {said} {finding}: nothing to bisect"


def trace_runner(trace: Trace, python_for: Callable[[str], tuple[Path, str]]) -> Runner:
    """Run ``trace`` on the interpreter ``python_for(candidate)`` names; its failure key."""

    def run(candidate: str) -> tuple[str, str | None]:
        python, version = python_for(candidate)
        with SchedulerDriver(python=python) as driver:
            outcome = run_trace(TARGET, trace, shipped_catalog(), driver=driver)
        if outcome.unsupported:
            raise TargetUnavailable(
                "the trace is unsupported there: " + "; ".join(outcome.unsupported)
            )
        return driver.version or version, failure_key(outcome)

    return run


def release_candidates(good: str, bad: str) -> list[str]:
    """Every release from ``good`` to ``bad`` (either order), oldest first."""
    low, high = sorted((Version(good), Version(bad)))
    known = sorted(set(index_releases()) | set(installed_versions()), key=Version)
    return [v for v in known if low <= Version(v) <= high]


def bisect_releases(
    trace: Trace, good: str, bad: str, name: str, finding: str | None = None
) -> Bisection:
    """The releases between ``good`` and ``bad``, each built when missing."""

    def python_for(release: str) -> tuple[Path, str]:
        return python_of(build_release(release)), release

    candidates, bad_last = release_candidates(good, bad), Version(bad) > Version(good)
    return bisect(candidates, trace_runner(trace, python_for), name, finding, bad_last)


def commit_candidates(repo: Path, span: str) -> list[str]:
    """``A..B``: A, then every commit on the path from A to B, oldest first."""
    start, _, end = span.partition("..")
    if not start or not end:
        raise BuildError(f"--commits {span!r}: give a range A..B")
    listed = _git(repo, "rev-list", "--reverse", "--ancestry-path", f"{start}..{end}")
    return [_git(repo, "rev-parse", "--short", start)[0], *(c[:12] for c in listed)]


def _git(repo: Path, *args: str) -> list[str]:
    run = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if run.returncode:
        said = (run.stderr.strip().splitlines() or ["git failed"])[-1]
        raise BuildError(f"{repo}: git {' '.join(args[:2])}: {said}")
    return run.stdout.split()


def bisect_commits(
    trace: Trace, repo: Path, span: str, name: str, finding: str | None = None
) -> Bisection:
    """The commits of ``span`` in the clone at ``repo``, each installed over the nearest
    release's venv in turn (which end is bad is not known: a finding on both needs naming)."""
    releases = installed_versions() or index_releases()

    def python_for(commit: str) -> tuple[Path, str]:
        version = checkout_version(repo, commit)
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp)
            _archive(repo, commit, tree)
            venv, _ = build_checkout(tree, releases, venv=BISECT_VENV, version=version)
        return python_of(venv), version

    return bisect(commit_candidates(repo, span), trace_runner(trace, python_for), name, finding)


def _archive(repo: Path, commit: str, into: Path) -> None:
    """``commit``'s tree under ``into`` (``git archive``: the clone's checkout untouched)."""
    archive = into / "tree.tar"
    cmd = ["git", "-C", str(repo), "archive", "--format=tar", "-o", str(archive), commit]
    if subprocess.run(cmd, capture_output=True).returncode:
        raise BuildError(f"{repo}: git archive {commit} failed")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
