"""What one trace on a real engine gave, in the same terms for every target: the engine's own
counts, kvspec's violations, what the engine's own checkers said, and why a run did not run.

Keeps: a counter a target does not count is ``None``, never 0, so a spec's ``expect`` goal is
judged only where the target can count it; a real engine's crash is a violation like any
other (the catalog's ``engine.*`` rules on the ``crash`` event, as on kvspec's engine), with the
crash record kept whole for the failure key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from engine.view import CrashView
from invariants.checking.checker import Violation
from invariants.scenarios.ops import Trace, op_label
from invariants.scenarios.spec import Spec

# a spec's ``expect`` counters (kvspec's scheduler names) -> TargetStats fields
GOALS = {
    "finished_reqs": "finished",
    "cached_tokens": "cached_tokens",
    "evicted_tokens": "evicted_tokens",
    "aborted_reqs": "aborted",
    "retracted_reqs": "retracted",
}
# the counters a report row shows: its label -> TargetStats field
SHOWN = {
    "finished": "finished",
    "cached": "cached_tokens",
    "evicted": "evicted_tokens",
    "aborted": "aborted",
    "retracted": "retracted",
}


@dataclass(frozen=True, slots=True)
class TargetStats:
    """What the real engine did, as its driver counted it (None: this target does not count
    it)."""

    steps: int = 0
    submitted: int | None = None
    admitted: int | None = None
    finished: int | None = None
    aborted: int | None = None
    rejected: int | None = None
    cached_tokens: int | None = None
    extend_tokens: int | None = None
    decode_tokens: int | None = None
    evicted_tokens: int | None = None
    forwards: int | None = None
    retracted: int | None = None
    preempted: int | None = None

    def __str__(self) -> str:
        counted = [(f.name, getattr(self, f.name)) for f in fields(self)]
        return ", ".join(f"{name}={value}" for name, value in counted if value is not None)


@dataclass(frozen=True, slots=True)
class EngineFinding:
    """One message of the engine's own checkers, at the iteration it was said."""

    iteration: int
    message: str


@dataclass(frozen=True, slots=True)
class TargetOutcome:
    """One trace (a spec's, or any) on one target and release. ``ok``: it ran, and neither
    kvspec's catalog nor the engine's own checkers fired, nor did it crash — unmet goals are
    shown, not failed (they were tuned on kvspec's schedule)."""

    target: str
    version: str
    trace: Trace | None
    stats: TargetStats
    violations: tuple[Violation, ...] = ()
    checks: int = 0
    seconds: float = 0.0
    error: str | None = None  # the driver refused an op, or the drain did not reach idle
    crash: CrashView | None = None  # the engine's own code raised (also a violation)
    spec: Spec | None = None
    unsupported: tuple[str, ...] = ()  # why the trace did not run at all
    unmet: tuple[str, ...] = ()
    findings: tuple[EngineFinding, ...] = ()  # the engine's own checkers
    notes: tuple[str, ...] = ()  # what the run did differently from kvspec's, said
    faults: tuple[dict[str, Any], ...] = ()  # what an injected fault did (driver report)
    stopped_at: int | None = None  # the op the run stopped in (len(ops): the drain)
    views: tuple[Any, ...] = field(default=(), repr=False)  # kept only when asked
    setup_seconds: float = 0.0  # of ``seconds``: the config op (building the engine)
    engine: str = ""  # the engine, as its target names it ("SGLang"): what its checker is called

    @property
    def ok(self) -> bool:
        return not (self.violations or self.findings or self.error or self.unsupported)

    @property
    def iterations(self) -> int:
        return self.stats.steps

    @property
    def stopped_in(self) -> str | None:
        """The op the run stopped in, as ``kvspec replay`` names it."""
        ops = () if self.trace is None else self.trace.ops
        if self.stopped_at is None:
            return None
        if self.stopped_at >= len(ops):
            return "the drain after the last op"
        return f"op #{self.stopped_at} ({op_label(ops[self.stopped_at])})"


@dataclass(frozen=True, slots=True)
class Disagreement:
    """An iteration where only one side's checks fired: the engine's own checkers
    (``engine-only``: a false-positive candidate in the engine's checker) or kvspec's catalog
    (``kvspec-only``: a bug the engine's checkers cannot see)."""

    iteration: int
    kind: str  # "engine-only" | "kvspec-only"
    detail: str
    engine: str = "the engine"

    def __str__(self) -> str:
        meaning = {
            "engine-only": f"{self.engine}'s checker fired, kvspec's census and sums held: "
            f"a false-positive candidate in {self.engine}'s checker",
            "kvspec-only": f"kvspec fired, {self.engine}'s checkers were silent: a bug "
            f"{self.engine} cannot see",
        }[self.kind]
        return f"iteration {self.iteration}: {meaning} — {self.detail}"


def disagreements(outcome: TargetOutcome, engine: str) -> tuple[Disagreement, ...]:
    """Iterations where exactly one side fired (the first message of each side), for a
    target whose driver records the engine's own checkers; a crash is no checker's verdict."""
    ours: dict[int, str] = {}
    for violation in outcome.violations:
        if violation.event == "crash":
            continue
        ours.setdefault(violation.step, f"[{violation.invariant}] {violation.message}")
    theirs: dict[int, str] = {}
    for finding in outcome.findings:
        theirs.setdefault(finding.iteration, finding.message)
    found = [Disagreement(i, "engine-only", m, engine) for i, m in theirs.items() if i not in ours]
    found += [Disagreement(i, "kvspec-only", m, engine) for i, m in ours.items() if i not in theirs]
    return tuple(sorted(found, key=lambda d: d.iteration))


def unsupported_outcome(target: str, spec: Spec | None, why: list[str]) -> TargetOutcome:
    """A trace the target cannot run: nothing ran, the reasons said."""
    return TargetOutcome(target, "", None, TargetStats(), spec=spec, unsupported=tuple(why))


def unmet_goals(spec: Spec | None, stats: TargetStats) -> tuple[str, ...]:
    """The spec's ``expect`` goals the run fell short of, among those the target counts."""
    expect = spec.expect if spec is not None else {}
    unmet = []
    for name, least in expect.items():
        got = getattr(stats, GOALS[name]) if name in GOALS else None
        if got is not None and got < least:
            unmet.append(f"{name} >= {least} (got {got})")
    return tuple(unmet)


def shown_counters(stats: TargetStats) -> dict[str, int]:
    """The counters a report row shows, those the target counts."""
    counted = {label: getattr(stats, name) for label, name in SHOWN.items()}
    return {label: value for label, value in counted.items() if value is not None}


def crash_record(crash: dict[str, Any]) -> CrashView:
    """A driver's crash record (``error``, ``message``, ``site``) as the crash view's entry:
    every real-engine crash is an ``exception`` (kvspec cannot tell an engine's accounting
    error from another by its class), but a stall the stepper saw (``kind``: stall)."""
    site = crash.get("site", "")
    message = crash.get("message", "")
    if "line" in crash:
        message += f" [raised at {crash['line']}]"
    return CrashView(crash.get("kind", "exception"), crash.get("error", ""), message, site=site)
