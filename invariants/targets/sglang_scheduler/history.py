"""Releases side by side: every installed SGLang release's real scheduler, run on kvspec's
default specs and an exploration budget, each finding one row — what fired (kvspec's
invariants or SGLang's own checker), at which iteration, which pages the census named, and the
command that replays it.

Keeps: a row says which side saw it. ``census``: kvspec fired while SGLang's checkers were
silent (a bug SGLang cannot see); ``sglang-false-positive``: SGLang's checker fired while
kvspec's census and sums held (the #22213 shape); ``both``: both fired at that iteration;
``crash``/``liveness``: SGLang raised, or a drain did not reach idle. A release whose venv is
missing or whose internals moved is a row-less entry with its one-line reason, never a finding.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from invariants.checking.checker import Violation
from invariants.checking.loader import shipped_catalog
from invariants.scenarios.matrix import default_spec_paths
from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import load_spec
from invariants.targets.driver import AdapterDrift, LineDriver, TargetUnavailable
from invariants.targets.explore import RealTarget, failure_key
from invariants.targets.outcome import TargetOutcome, disagreements
from invariants.targets.registry import TargetOptions, target
from invariants.targets.run import run_spec, run_trace
from invariants.targets.sglang_scheduler.bisect import finding_name
from invariants.targets.sglang_scheduler.releases import ROOT, SchedulerDriver, installed_versions
from invariants.targets.streamed import explore_real

TARGET = target("sglang-scheduler")
PAGES = re.compile(r"pages?\b[^\[]*\[([\d, ]+)\]")  # the census's "... pages ...: [3, 7]"


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One finding on one release."""

    release: str
    source: str  # a spec's name, or "explore seed N"
    kind: str  # census | sglang-false-positive | both | crash | liveness
    invariant: str  # "+"-joined kvspec ids, or "sglang: <message head>", or the error
    iteration: int | None
    pages: tuple[int, ...]
    replay: str
    detail: str
    iterations: int = 1  # how many iterations said it (SGLang's false positives repeat)


@dataclass(slots=True)
class ReleaseHistory:
    """One release's runs: how many specs ran clean, the exploration's numbers, the rows."""

    release: str
    specs_run: int = 0
    specs_clean: int = 0
    unsupported: list[str] = field(default_factory=list)
    seeds: int = 0
    seeds_failed: int = 0
    first_finding_s: float | None = None
    seconds: float = 0.0
    rows: list[HistoryRow] = field(default_factory=list)
    error: str | None = None  # no venv, or the release's internals moved


def pages_named(violations: list[Violation]) -> tuple[int, ...]:
    """The page ids the census's messages name (leaked, duplicated, foreign)."""
    found: set[int] = set()
    for violation in violations:
        for match in PAGES.finditer(violation.message):
            found.update(int(p) for p in match.group(1).replace(" ", "").split(",") if p)
    return tuple(sorted(found))


def rows_of(outcome: TargetOutcome, source: str, replay: str) -> list[HistoryRow]:
    """The rows one run on one release gives (none when it ran clean)."""
    rows = [*_violation_row(outcome, source, replay), *_false_positive_row(outcome, source, replay)]
    if outcome.error:
        kind = "liveness" if "not idle after" in outcome.error else "crash"
        said = failure_key(outcome) if outcome.crash is not None else outcome.error[:80]
        rows.append(
            HistoryRow(outcome.version, source, kind, str(said), None, (), replay, outcome.error)
        )
    return rows


def _violation_row(outcome: TargetOutcome, source: str, replay: str) -> list[HistoryRow]:
    """The first failing view's row (a crash's is the crash row)."""
    if not outcome.violations or outcome.violations[0].event == "crash":
        return []
    first, fired = outcome.violations[0], {f.iteration for f in outcome.findings}
    view = [v for v in outcome.violations if (v.step, v.event) == (first.step, first.event)]
    kind = "both" if first.step in fired else "census"
    key = "+".join(dict.fromkeys(v.invariant for v in view))
    detail = "; ".join(v.message for v in view)[:300]
    pages = pages_named(view)
    return [HistoryRow(outcome.version, source, kind, key, first.step, pages, replay, detail)]


def _false_positive_row(outcome: TargetOutcome, source: str, replay: str) -> list[HistoryRow]:
    """SGLang's checker firing while kvspec's census and sums held, once with its count."""
    positives = [d for d in disagreements(outcome, "SGLang") if d.kind == "engine-only"]
    if not positives:
        return []
    first = positives[0]
    head = "sglang: " + " ".join(first.detail.split()[:4])
    detail, count = first.detail[:300], len(positives)
    kind = "sglang-false-positive"
    return [
        HistoryRow(outcome.version, source, kind, head, first.iteration, (), replay, detail, count)
    ]


def spec_rows(history: ReleaseHistory, driver: LineDriver, specs: list[Path]) -> None:
    """Each default spec on the release's driver: its rows, or why it cannot run."""
    catalog, flags = shipped_catalog(), _flags(history.release)
    for path in specs:
        spec = load_spec(path)
        outcome = run_spec(TARGET, spec, catalog, driver=driver)
        if outcome.unsupported:
            history.unsupported.append(spec.name)
            continue
        history.specs_run += 1
        history.specs_clean += outcome.ok
        where = f"  # stops in {outcome.stopped_in}" if outcome.stopped_in else ""
        replay = f"kvspec run {_relative(path)} {flags}{where}"
        history.rows.extend(rows_of(outcome, spec.name, replay))


def explore_rows(
    history: ReleaseHistory,
    driver: LineDriver,
    seeds: int,
    steps: int,
    workers: int,
    out_dir: Path,
) -> None:
    """The exploration budget on the release; each distinct failure, shrunk, as its rows
    (the shrunk trace re-run once, so the row's iteration and pages are the replay's)."""
    explored = RealTarget(TARGET.name, TargetOptions(version=history.release))
    report = explore_real(
        explored, seeds, steps, workers=workers, out_dir=out_dir / history.release
    )
    history.seeds, history.seeds_failed = len(report.results), len(report.failed)
    history.first_finding_s = report.first_failure_s
    flags = _flags(history.release)
    for finding in report.findings:
        outcome = run_trace(TARGET, Trace.load(finding.path), shipped_catalog(), driver=driver)
        replay = f"kvspec replay {_relative(finding.path)} {flags}"
        history.rows.extend(rows_of(outcome, f"explore seed {finding.seed}", replay))


def release_history(
    release: str, specs: list[Path], seeds: int, steps: int, workers: int, out_dir: Path
) -> ReleaseHistory:
    """One release: the default specs, then the exploration budget."""
    start, history = time.perf_counter(), ReleaseHistory(release)
    try:
        with SchedulerDriver(release) as driver:
            spec_rows(history, driver, specs)
            if seeds:
                explore_rows(history, driver, seeds, steps, workers, out_dir)
    except (AdapterDrift, TargetUnavailable) as exc:
        history.error = str(exc)
    history.seconds = time.perf_counter() - start
    return history


def sglang_history(
    versions: list[str] | None = None,
    seeds: int = 40,
    steps: int = 200,
    workers: int = 2,
    out_dir: Path = Path("explore-failures/history"),
    specs: list[Path] | None = None,
) -> list[ReleaseHistory]:
    """Every release asked for (default: every installed one), oldest first."""
    chosen = specs if specs is not None else default_spec_paths()
    return [
        release_history(v, chosen, seeds, steps, workers, out_dir)
        for v in versions or installed_versions()
    ]


@dataclass(frozen=True, slots=True)
class FindingSpan:
    """One finding across the releases run: where it was seen, the first and the last."""

    kind: str
    invariant: str
    releases: tuple[str, ...]  # oldest first
    clean: tuple[str, ...]  # the releases run where it was not seen

    @property
    def first(self) -> str:
        return self.releases[0]

    @property
    def last(self) -> str:
        return self.releases[-1]


def finding_spans(histories: list[ReleaseHistory]) -> list[FindingSpan]:
    """Each distinct (kind, invariant) the releases showed, with the releases that showed it
    — the release x finding table's rows (a release not run is neither seen nor clean; a
    crash site is its file and function, so a module's move keeps one finding)."""
    ran = [h.release for h in histories if h.error is None]
    seen: dict[tuple[str, str], set[str]] = {}
    for history in histories:
        for row in history.rows:
            seen.setdefault((row.kind, span_key(row.invariant)), set()).add(history.release)
    spans = []
    for (kind, invariant), where in seen.items():
        releases = tuple(r for r in ran if r in where)
        clean = tuple(r for r in ran if r not in where)
        spans.append(FindingSpan(kind, invariant, releases, clean))
    return sorted(spans, key=lambda s: (ran.index(s.first), s.invariant))


def span_key(invariant: str) -> str:
    """A row's finding as its span names it: kvspec's ids with each crash site cut to its file
    and function; an engine checker's message without its numbers (as a failure key says it)."""
    if not invariant.startswith("sglang:"):
        return finding_name(invariant)
    return " ".join(w for w in invariant.split() if not any(map(str.isdigit, w)))


def history_json(histories: list[ReleaseHistory]) -> dict:
    """The JSON form (``--json``): one entry per release, its rows as records, and each
    finding's span over the releases."""
    spans = [dict(asdict(s), first=s.first, last=s.last) for s in finding_spans(histories)]
    return {"releases": [asdict(h) for h in histories], "findings": spans}


def _flags(release: str) -> str:
    return f"--target sglang-scheduler --target-version {release}"


def _relative(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
