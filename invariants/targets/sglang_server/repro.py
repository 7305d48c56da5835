"""`kvspec sglang repro`: a finding as a reproducer a maintainer runs without kvspec — the
finding's trace on SGLang's real server (checked, gated: what it is), its HTTP calls as a
script needing only Python's standard library and the server's flags as a launch line
(driver/reproducer.py writes both), validated by running them against a fresh server on CPU,
and an issue text.

Keeps: a reproducer is written as validated only when the script, run against a server with
no kvspec gate in it, observed the failure on its own; a finding only kvspec's catalog sees (a
leak SGLang's checks miss, a wrong count) is said to be not reproducible over HTTP, with the
reason, and the script is kept beside as what was tried. Affected releases come from running
the trace on every installed release's real scheduler (the same failure key, bisect.py's
verdicts); the mechanism is SGLang's own traceback, frame by frame, in that release.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from invariants.checking.loader import shipped_catalog
from invariants.scenarios.ops import Trace
from invariants.targets.driver import AdapterDrift, TargetUnavailable
from invariants.targets.explore import failure_key
from invariants.targets.outcome import TargetOutcome
from invariants.targets.registry import target
from invariants.targets.run import run_trace
from invariants.targets.sglang_scheduler.bisect import verdict
from invariants.targets.sglang_scheduler.releases import SchedulerDriver, installed_versions
from invariants.targets.sglang_server.adapter import ServerDriver, config
from invariants.targets.sglang_server.issue import issue_text

SERVER, SCHEDULER = target("sglang-server"), target("sglang-scheduler")
VALIDATOR = Path(__file__).resolve().parent / "driver" / "reproducer.py"


class NothingToReproduce(RuntimeError):
    """The trace runs clean on the server (or cannot run there): no finding to write up."""


@dataclass(frozen=True, slots=True)
class Reproduction:
    key: str  # the failure key on the server
    validated: bool  # the script alone observed the failure
    said: str  # what the script printed on the validation run
    out: Path
    releases: tuple[str, ...]  # installed releases where the scheduler target shows it
    clean: tuple[str, ...]  # installed releases where it does not


def reproduce(
    trace: Trace, version: str | None, out: Path, tries: int, history: bool
) -> Reproduction:
    """The finding of ``trace`` on the release's server, written up in ``out``."""
    driver = ServerDriver(version)
    with driver:
        # level 1: past the first violation to what a client would see (a crash), if any
        outcome = run_trace(SERVER, trace, shipped_catalog(), 1, driver=driver)
        timeline, python = driver.timeline, driver.python
    key = failure_key(outcome)
    if outcome.unsupported or key is None:
        why = "; ".join(outcome.unsupported) or "it runs clean"
        raise NothingToReproduce(f"{trace.name} on sglang {outcome.version}'s server: {why}")
    request = dict(
        cfg=config(trace), sent=timeline.sent, finished_at=timeline.finished_at,
        title=title(outcome), expected=expected(outcome), out=str(out.resolve()), tries=tries,
    )  # fmt: skip
    out = out.resolve()  # the validator runs in its own folder
    out.mkdir(parents=True, exist_ok=True)
    answer = _validate(python, request)
    validated = answer["rc"] == 1
    found, clean = affected(trace, key) if history else ((outcome.version,), ())
    heading = (title(outcome), expected(outcome))
    text = issue_text(outcome, key, timeline.crash, answer, (found, clean), heading)
    (out / "ISSUE.md").write_text(text, encoding="utf-8")
    trace.save(out / "trace.json")
    return Reproduction(key, validated, answer["output"], out, found, clean)


def _validate(python: Path, request: dict) -> dict:
    ran = subprocess.run(
        [str(python), str(VALIDATOR)], input=json.dumps(request), capture_output=True,
        text=True, cwd=VALIDATOR.parent,
    )  # fmt: skip
    if ran.returncode != 0 or not ran.stdout.strip():
        raise TargetUnavailable(f"the reproducer's validation failed: {ran.stderr.strip()[-400:]}")
    return json.loads(ran.stdout.strip().splitlines()[-1])


def affected(trace: Trace, key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Installed releases whose real scheduler shows the same finding, and those it does not."""
    found: list[str] = []
    clean: list[str] = []
    for release in installed_versions():
        try:
            with SchedulerDriver(release) as driver:
                outcome = run_trace(SCHEDULER, trace, shipped_catalog(), driver=driver)
        except (TargetUnavailable, AdapterDrift):
            continue
        said = verdict(key, failure_key(outcome))
        (found if said == "present" else clean).append(release)
    return tuple(found), tuple(clean)


def title(outcome: TargetOutcome) -> str:
    crash = outcome.crash
    if crash is not None:
        message = crash.message.split(" [raised at ")[0]
        return (
            f"Scheduler dies with {crash.error} in {crash.site.rsplit('/', 1)[-1]}: {message[:80]}"
        )
    first = outcome.violations[0] if outcome.violations else None
    return (
        first.title
        if first is not None
        else f"SGLang's own check: {outcome.findings[0].message[:80]}"
    )


def expected(outcome: TargetOutcome) -> str:
    if outcome.crash is not None:
        return (
            "each request is answered (200, or a 4xx naming the problem); the server keeps serving"
        )
    first = outcome.violations[0] if outcome.violations else None
    return first.title if first is not None else "SGLang's own memory checks stay silent"
