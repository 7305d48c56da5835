"""A finding's issue text, as a maintainer would file it: title, affected releases, what
happens and what should, the mechanism (SGLang's own traceback in that release, frame by
frame with its source line), and how to reproduce it without kvspec (and with it).

Keeps: every sentence is something the run showed — the traceback's frames, the catalog's
message, the validation run's output; a finding kvspec alone saw says so.
"""

from __future__ import annotations

import re
from typing import Any

from invariants.targets.outcome import TargetOutcome

FRAME = re.compile(r'File "[^"]*/(sglang/[^"]+)", line (\d+), in (\w+)\n\s*(.*)')
FRAMES = 6  # SGLang frames the mechanism lists (the deepest)


def mechanism(trace_text: str) -> list[str]:
    """The deepest SGLang frames of a traceback: ``file:line function`` and its line."""
    frames = FRAME.findall(trace_text)
    return [
        f"- `{path}:{line}` in `{func}`: `{code.strip()}`"
        for path, line, func, code in frames[-FRAMES:]
    ]


def issue_text(
    outcome: TargetOutcome,
    key: str,
    crash: dict[str, Any] | None,
    answer: dict[str, Any],
    releases: tuple[tuple[str, ...], tuple[str, ...]],
    heading: tuple[str, str],
) -> str:
    """The whole ISSUE.md (``heading``: the title and the expected behaviour)."""
    title, expected = heading
    found, clean = releases
    validated = answer["rc"] == 1
    lines = [
        f"# {title}",
        "",
        f"Found by kvspec on SGLang {outcome.version}'s real HTTP server (only the model forward "
        f"faked); failure key `{key}`.",
        "",
        "## Affected releases",
        f"- shows it: {', '.join(found) or '-'}",
        f"- does not: {', '.join(clean) or '-'} (of the releases installed where this was written)",
        "",
        "## What happens",
        *observed(outcome, crash),
        "",
        "## What should happen",
        expected[0].upper() + expected[1:] + ".",
        "",
    ]
    if crash is not None:
        lines += [
            "## Mechanism (the traceback's SGLang frames, deepest last)",
            *mechanism(crash.get("trace", "")),
            "",
        ]
    lines += reproduce(answer, validated)
    return "\n".join(lines) + "\n"


def observed(outcome: TargetOutcome, crash: dict[str, Any] | None) -> list[str]:
    if outcome.crash is not None:
        c = outcome.crash
        return [
            f"The scheduler process raises `{c.error}: {c.message}` (`{c.site}`); SGLang's "
            "launcher is sent SIGQUIT and the whole server goes down: every open request gets "
            "a dropped connection, the port then refuses connections.",
        ]
    said = [f"- `[{v.invariant}]` step {v.step}: {v.message}" for v in outcome.violations[:3]]
    said += [f"- SGLang's own check: {f.message}" for f in outcome.findings[:2]]
    return ["kvspec's catalog (checked inside the scheduler process, every iteration):", *said]


def reproduce(answer: dict[str, Any], validated: bool) -> list[str]:
    head = (
        "Validated: run against a fresh server on CPU (kvspec's fake worker, no kvspec gate, "
        "SGLang's strict memory checks on), the script alone observed it:"
        if validated
        else "Not reproducible over HTTP alone: the script, run against a fresh server on CPU, "
        "did not observe it — the failure is one only kvspec's checks see (or it needs "
        "kvspec's deterministic receive). The script is kept as what was tried:"
    )
    log = answer.get("log_tail") or []
    return [
        "## Reproduce",
        "`launch.sh` starts the server (SGLang's own flags; any small model), then "
        "`python repro.py --port 30000` (Python standard library only; exit 1: observed).",
        "",
        head,
        "```",
        answer["output"],
        "```",
        *(["Server log:", "```", *log, "```"] if validated and log else []),
        "",
        "With kvspec: `kvspec replay trace.json --target sglang-server` (deterministic: the "
        "gate holds each receive until the trace's requests arrived).",
    ]
