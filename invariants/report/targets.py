"""`kvspec report --target sglang|both`: every default spec, as written, also run on real
SGLang's memory classes (invariants/targets/sglang/), and the two targets side by side.

Keeps: the same verdict rules as the kvspec rows, with two stated exceptions — a spec the
adapter cannot run is shown as unsupported with the reason (not a failure), and an unmet
``expect`` goal on the sglang target is shown but does not fail the report (the goals were
tuned on kvspec's schedule, which the glue's FCFS loop does not reproduce). A violation or a
crash on the sglang target fails the report, with the command that replays it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from invariants.checking.checker import Level
from invariants.checking.loader import shipped_catalog
from invariants.report.cells import ReportCell
from invariants.report.model import MAX_LISTED, CellResult, SideBySide, TargetRow
from invariants.report.text import goals_text, violation_line
from invariants.scenarios.matrix import relative
from invariants.scenarios.spec import load_spec

REAL_TARGETS = ("sglang", "sglang-scheduler", "vllm")  # `all`: each of them, in this order
TARGETS = ("kvspec", "sglang", "both", "sglang-scheduler", "vllm", "all")
GOALS_NOTE = (
    "expect goals were tuned on kvspec's schedule: on the sglang target an unmet goal is "
    "shown, not a failure; an unsupported spec is shown with its reason"
)


def target_row(name: str, path: Path, outcome: Any, target: str = "sglang") -> TargetRow:
    """An ``SGLangOutcome`` of ``invariants.targets.sglang.run`` (or the vllm target's) as a row."""
    replay = f"kvspec run {relative(path)} --target {target}"
    if outcome.unsupported:
        return TargetRow(name, replay, unsupported="; ".join(outcome.unsupported), target=target)
    s = outcome.stats
    counters = {
        "finished": s.finished,
        "cached": s.prefix_hit_tokens,
        "evicted": s.evicted_tokens,
        "aborted": s.aborted,
    }
    listed = tuple(asdict(v) for v in outcome.violations[:MAX_LISTED])
    return TargetRow(
        name,
        replay,
        s.steps,
        outcome.checks,
        len(outcome.violations),
        listed,
        outcome.unmet,
        outcome.error,
        None,
        outcome.seconds,
        counters,
        outcome.notes,
        outcome.sglang_version,
        target,
    )


class _Drivers:
    """One sglang driver for all rows (its start is most of a short run); a fresh one after
    a driver that died, so one crash does not hide the rows after it. A driver passed in
    (tests reuse one) is used but not closed."""

    def __init__(self, python: str | None, given: Any = None) -> None:
        self.python, self.live, self.given = python, given, given

    def get(self) -> Any:
        from invariants.targets.sglang.target import SGLangDriver

        if self.live is None:
            self.live = SGLangDriver(self.python)
        return self.live

    def drop(self, dead: bool = False) -> None:
        """Close our own driver; after a death, forget the given one too."""
        if self.live is not None and self.live is not self.given:
            with contextlib.suppress(OSError):
                self.live.close()
        if dead:
            self.given = None
        if self.live is not self.given:
            self.live = None


def run_sglang_rows(
    specs: list[tuple[str, Path]],
    level: int = Level.RECORD,
    python: str | None = None,
    progress: Callable[[TargetRow], None] = lambda row: None,
    *,
    driver: Any = None,
) -> list[TargetRow]:
    """Every spec of ``specs`` on the sglang target, in order; ``SGLangUnavailable`` (before
    any run) when there is no sglang interpreter or its driver does not start. ``driver``:
    reuse a running one."""
    from invariants.targets.sglang.run import run_spec_on_sglang
    from invariants.targets.sglang.target import SGLangUnavailable, sglang_python, unavailable_reason

    reason = unavailable_reason(sglang_python(python))
    if reason:
        raise SGLangUnavailable(reason)
    catalog, drivers, rows = shipped_catalog(), _Drivers(python, driver), []
    drivers.get()  # a driver that cannot start is the whole target's problem (exit 2)
    try:
        for name, path in specs:
            try:
                row = target_row(
                    name,
                    path,
                    run_spec_on_sglang(load_spec(path), catalog, level, driver=drivers.get()),
                )
            except (SGLangUnavailable, OSError) as exc:  # the driver died mid-run
                row = TargetRow(
                    name,
                    f"kvspec run {relative(path)} --target sglang",
                    error=f"sglang driver died: {exc}",
                )
                drivers.drop(dead=True)
            rows.append(row)
            progress(row)
    finally:
        drivers.drop()
    return rows


def as_written_cells(specs: list[tuple[str, Path]], have: Collection[str] = ()) -> list[ReportCell]:
    """The kvspec cells of ``specs`` run as written (their sglang counterparts), except
    those already among the report's cells by name (a spec without matrix axes)."""
    return [
        ReportCell(name, f"kvspec run {relative(path)}", spec=load_spec(path))
        for name, path in specs
        if name not in have
    ]


def side_by_side(kvspec: list[CellResult], sglang: list[TargetRow]) -> list[SideBySide]:
    """Each sglang row with the kvspec cell of the same name, in sglang row order."""
    by_name = {r.name: r for r in kvspec}
    return [SideBySide(row.name, by_name.get(row.name), row) for row in sglang]


def kvspec_text(r: CellResult | None) -> str:
    """``steps / violations / goals`` of a kvspec cell."""
    if r is None:
        return "not run"
    return f"{r.steps} / {r.num_violations} / {goals_text(r.error, r.unmet)}"


def sglang_text(row: TargetRow) -> str:
    """``steps / violations / goals`` of an sglang row, or why it did not run."""
    if row.unsupported:
        return f"unsupported: {row.unsupported}"
    return f"{row.steps} / {row.num_violations} / {goals_text(row.error, row.unmet)}"


def sglang_detail(row: TargetRow) -> str:
    """The first violation, crash or unmet goal of a row (what its verdict rests on)."""
    if row.violations:
        return violation_line(row.violations[0], event=False)
    if row.error:
        return f"crashed: {row.error}"
    if row.checker:
        return f"SGLang's own checker, {row.checker[0]}"
    return "; ".join(f"expected {goal}" for goal in row.unmet)


def sglang_summary(rows: list[TargetRow]) -> dict[str, Any]:
    """Totals over the sglang rows; ``ok``: none violated or crashed."""
    ran = [r for r in rows if not r.unsupported]
    return {
        "rows": len(rows),
        "ran": len(ran),
        "unsupported": len(rows) - len(ran),
        "failed": sum(not r.ok for r in rows),
        "violations": sum(r.num_violations for r in rows),
        "unmet_goals": sum(len(r.unmet) for r in rows),
        "crashed": sum(r.error is not None for r in rows),
        "checks": sum(r.checks for r in rows),
        "ok": all(r.ok for r in rows),
    }


def sglang_version(rows: list[TargetRow]) -> str:
    return next((r.version for r in rows if r.version), "")


def target_label(rows: list[TargetRow]) -> str:
    """The real engine the rows ran on, as the titles name it."""
    return "vLLM" if rows and rows[0].target == "vllm" else "SGLang"


def run_vllm_rows(
    specs: list[tuple[str, Path]],
    level: int = Level.RECORD,
    progress: Callable[[TargetRow], None] = lambda row: None,
) -> list[TargetRow]:
    """Every spec of ``specs`` on vLLM's real scheduler, one driver for all (its import is
    most of a run); ``VLLMUnavailable`` up front when there is no vllm interpreter."""
    from invariants.targets.vllm.run import run_spec_on_vllm
    from invariants.targets.vllm.target import VLLMDriver

    catalog, rows = shipped_catalog(), []
    with VLLMDriver() as driver:
        for name, path in specs:
            outcome = run_spec_on_vllm(load_spec(path), catalog, level, driver=driver)
            rows.append(target_row(name, path, outcome, "vllm"))
            progress(rows[-1])
    return rows


def sglang_document(pairs: list[SideBySide]) -> dict[str, Any]:
    """report.json's ``sglang`` part: its summary, the note on goals, every pair (several
    targets: one such part per target under ``targets``)."""
    groups = by_target(pairs)
    if len(groups) > 1:
        return {"targets": {name: sglang_document(group) for name, group in groups.items()}}
    rows = [p.sglang for p in pairs]
    return {
        "version": sglang_version(rows),
        "note": GOALS_NOTE,
        "summary": sglang_summary(rows),
        "side_by_side": [
            {
                "spec": p.name,
                "kvspec": kvspec_text(p.kvspec),
                "sglang": sglang_text(p.sglang),
                "sglang_row": p.sglang.to_dict(),
            }
            for p in pairs
        ],
    }


def verdict(totals: dict[str, Any], pairs: list[SideBySide] | None) -> str:
    """PASS, or FAIL with the failing kvspec cells and real-engine rows."""
    failed_rows = sglang_summary([p.sglang for p in pairs])["failed"] if pairs else 0
    if totals["ok"] and not failed_rows:
        return "PASS"
    parts = [f"{totals['failed']} of {totals['cells']} cells"]
    if pairs is not None:
        parts.append(f"{failed_rows} of {len(pairs)} {rows_word(pairs)} rows")
    return "FAIL — " + ", ".join(parts)


def by_target(pairs: list[SideBySide]) -> dict[str, list[SideBySide]]:
    """The pairs of each real-engine target, in the order the targets ran."""
    groups: dict[str, list[SideBySide]] = {}
    for p in pairs:
        groups.setdefault(p.sglang.target, []).append(p)
    return groups


def rows_word(pairs: Sequence[SideBySide]) -> str:
    """What the rows are called: their one target's name, else "real-engine"."""
    targets = {p.sglang.target for p in pairs}
    return next(iter(targets)) if len(targets) == 1 else "real-engine"


def failing_rows(pairs: list[SideBySide]) -> Iterator[TargetRow]:
    return (p.sglang for p in pairs if not p.sglang.ok)
