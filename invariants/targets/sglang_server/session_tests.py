"""`kvspec sglang session-tests`: the release's own streaming-session tests against its real
server on CPU (driver/session_tests.py runs them under the release's interpreter; only the
server launch is kvspec's), each test's outcome as a row.

Keeps: what SGLang's tests say is theirs — a failure is reported with its assertion and, when
the scheduler died, SGLang's exception from the server log; a test that cannot run on CPU is
named with the reason. A release whose wheel ships no streaming-session kits says so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from invariants.targets.driver import TargetUnavailable
from invariants.targets.sglang_scheduler.releases import DEFAULT_VERSION, scheduler_python
from invariants.terminal import Col, out_console, print_table

RUNNER = Path(__file__).resolve().parent / "driver" / "session_tests.py"
TIMEOUT = 3600


def run_session_tests(version: str | None, tests: list[str]) -> list[dict[str, Any]]:
    """Each test's ``{suite, test, outcome, detail}``, in the order they ran."""
    python = scheduler_python(version)
    if not python.exists():
        raise TargetUnavailable(f"no sglang interpreter at {python}: run `make sglang-env`")
    ran = subprocess.run(
        [str(python), str(RUNNER), *tests], capture_output=True, text=True,
        timeout=TIMEOUT, cwd=RUNNER.parent,
    )  # fmt: skip
    results = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    if not results:
        tail = " | ".join(ran.stderr.strip().splitlines()[-3:])
        raise TargetUnavailable(f"sglang {version or DEFAULT_VERSION}'s session tests: {tail}")
    return results


def print_results(results: list[dict[str, Any]]) -> None:
    rows = [[r["suite"], r["test"], r["outcome"], first_line(r["detail"])] for r in results]
    cols = (Col("suite"), Col("test"), Col("outcome"), Col("why", "text"))
    print_table(out_console(), cols, rows)


def first_line(detail: str) -> str:
    """A failure's last line (the assertion), or a skip's reason."""
    lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
    exception = [line for line in lines if "Error" in line or "assert" in line.lower()]
    return (exception or lines or [""])[-1][:200]
