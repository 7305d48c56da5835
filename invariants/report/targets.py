"""`kvspec report --target NAME[,NAME…]`: every default spec, as written, also run on real
engines (the registry's targets, invariants/targets/), each beside kvspec's cell of the same
spec.

Keeps: the same verdict rules as the kvspec rows, with two stated exceptions — a spec a target
cannot run is shown as unsupported with the reason (not a failure), and an unmet ``expect``
goal on a real target is shown but does not fail the report (the goals were tuned on kvspec's
schedule, which a real engine's own scheduler, or the glue's FCFS loop, does not reproduce).
A violation, the engine's own checker firing, or a crash fails the report, with the command
that replays it. A row is built from a ``TargetOutcome`` alone, the same way for every target.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from invariants.checking.loader import shipped_catalog
from invariants.report.cells import ReportCell
from invariants.report.model import MAX_LISTED, CellResult, SideBySide, TargetRow
from invariants.report.text import goals_text, violation_line
from invariants.scenarios.matrix import relative
from invariants.scenarios.spec import load_spec
from invariants.targets.driver import LineDriver, TargetUnavailable
from invariants.targets.outcome import TargetOutcome, shown_counters
from invariants.targets.registry import NAMES, TARGETS, Target, TargetOptions
from invariants.targets.run import run_spec
from invariants.targets.text import target_flags

ALIASES = {"all": NAMES, "both": ("kvspec", "sglang")}  # `both`: the 0.x name, one release more
GOALS_NOTE = (
    "expect goals were tuned on kvspec's schedule: on a real engine an unmet goal is shown, "
    "not a failure; an unsupported spec is shown with its reason"
)
CHECKER_LISTED = 3  # the engine's own checker messages kept per row


def chosen_targets(text: str) -> tuple[str, ...]:
    """``--target`` as the targets it names (comma-separated; ``all``: every real engine;
    ``kvspec`` among them: the whole kvspec report too); ValueError naming an unknown one."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        names += ALIASES.get(part, (part,))
    unknown = [n for n in names if n != "kvspec" and n not in NAMES]
    if unknown or not names:
        choices = ", ".join(("kvspec", *NAMES, *ALIASES))
        raise ValueError(f"--target {text!r}: choose from {choices} (comma-separated)")
    return tuple(dict.fromkeys(names))


def target_row(
    entry: Target, name: str, path: Path, outcome: TargetOutcome, flags: str
) -> TargetRow:
    """Spec ``name``'s outcome on one real target as a row."""
    replay = f"kvspec run {relative(path)} {flags}"
    if outcome.unsupported:
        why = "; ".join(outcome.unsupported)
        return TargetRow(name, replay, unsupported=why, target=entry.name)
    said = [f"iteration {f.iteration}: {f.message[:200]}" for f in outcome.findings]
    return TargetRow(
        name,
        replay + (f"  # stops in {outcome.stopped_in}" if outcome.stopped_in else ""),
        steps=outcome.iterations,
        checks=outcome.checks,
        num_violations=len(outcome.violations),
        violations=tuple(asdict(v) for v in outcome.violations[:MAX_LISTED]),
        unmet=outcome.unmet,
        error=outcome.error,
        seconds=outcome.seconds,
        counters=shown_counters(outcome.stats),
        notes=outcome.notes,
        version=outcome.version,
        target=entry.name,
        checker=tuple(said[:CHECKER_LISTED]),
    )


class _Driver:
    """One driver for all of a target's rows (its start is most of a short run); a fresh one
    after a driver that died, so one death does not hide the rows after it. A driver passed
    in (tests reuse one) is used but not closed."""

    def __init__(self, entry: Target, options: TargetOptions, given: LineDriver | None) -> None:
        self.entry, self.options, self.live, self.given = entry, options, given, given

    def get(self) -> LineDriver:
        if self.live is None:
            self.live = self.entry.adapter().open_driver(self.options)
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


def target_rows(
    entry: Target,
    specs: list[tuple[str, Path]],
    level: int,
    options: TargetOptions | None = None,
    progress: Callable[[TargetRow], None] = lambda row: None,
    *,
    driver: LineDriver | None = None,
) -> list[TargetRow]:
    """Every spec of ``specs`` on ``entry``, in order, checked at ``level`` or the target's own,
    whichever is stricter; ``TargetUnavailable`` before any run when no driver starts."""
    options = options or TargetOptions()
    catalog, drivers, rows = shipped_catalog(), _Driver(entry, options, driver), []
    drivers.get()  # a driver that cannot start is the whole target's problem (exit 2)
    flags, level = target_flags(entry.name, options), max(level, entry.level)
    try:
        for name, path in specs:
            try:
                outcome = run_spec(entry, load_spec(path), catalog, level, driver=drivers.get())
                row = target_row(entry, name, path, outcome, flags)
            except (TargetUnavailable, OSError) as exc:  # the driver died mid-run
                error = f"{entry.name} driver died: {exc}"
                replay = f"kvspec run {relative(path)} {flags}"
                row = TargetRow(name, replay, error=error, target=entry.name)
                drivers.drop(dead=True)
            rows.append(row)
            progress(row)
    finally:
        drivers.drop()
    return rows


def as_written_cells(specs: list[tuple[str, Path]], have: Collection[str] = ()) -> list[ReportCell]:
    """The kvspec cells of ``specs`` run as written (their real-engine counterparts), except
    those already among the report's cells by name (a spec without matrix axes)."""
    return [
        ReportCell(name, f"kvspec run {relative(path)}", spec=load_spec(path))
        for name, path in specs
        if name not in have
    ]


def side_by_side(kvspec: list[CellResult], rows: list[TargetRow]) -> list[SideBySide]:
    """Each real-engine row with the kvspec cell of the same name, in row order."""
    by_name = {r.name: r for r in kvspec}
    return [SideBySide(row.name, by_name.get(row.name), row) for row in rows]


def kvspec_text(r: CellResult | None) -> str:
    """``steps / violations / goals`` of a kvspec cell."""
    if r is None:
        return "not run"
    return f"{r.steps} / {r.num_violations} / {goals_text(r.error, r.unmet)}"


def row_text(row: TargetRow) -> str:
    """``steps / violations / goals`` of a real-engine row, or why it did not run."""
    if row.unsupported:
        return f"unsupported: {row.unsupported}"
    return f"{row.steps} / {row.num_violations} / {goals_text(row.error, row.unmet)}"


def row_detail(row: TargetRow) -> str:
    """The first violation, crash, engine checker message or unmet goal of a row (what its
    verdict rests on)."""
    if row.violations:
        return violation_line(row.violations[0], event=False)
    if row.error:
        return f"crashed: {row.error}"
    if row.checker:
        return f"{engine_of(row)}'s own checker, {row.checker[0]}"
    return "; ".join(f"expected {goal}" for goal in row.unmet)


def engine_of(row: TargetRow) -> str:
    """The engine a row ran on, as titles name it."""
    return next((t.engine for t in TARGETS if t.name == row.target), row.target)


def rows_summary(rows: list[TargetRow]) -> dict[str, Any]:
    """Totals over the rows; ``ok``: none violated, fired the engine's checker or crashed."""
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


def version_of(rows: list[TargetRow]) -> str:
    return next((r.version for r in rows if r.version), "")


def targets_document(pairs: list[SideBySide]) -> dict[str, Any]:
    """report.json's ``targets``: per target, its version, the note on goals, its summary and
    every pair."""
    return {name: _document(group) for name, group in by_target(pairs).items()}


def _document(pairs: list[SideBySide]) -> dict[str, Any]:
    rows = [p.row for p in pairs]
    return {
        "version": version_of(rows),
        "note": GOALS_NOTE,
        "summary": rows_summary(rows),
        "side_by_side": [
            {
                "spec": p.name,
                "kvspec": kvspec_text(p.kvspec),
                "target": row_text(p.row),
                "row": p.row.to_dict(),
            }
            for p in pairs
        ],
    }


def legacy_sglang_document(pairs: list[SideBySide]) -> dict[str, Any]:
    """report.json's ``sglang`` key as 0.x wrote it (one release more, then gone): one
    target's part, or ``{"targets": {...}}`` for several, with ``sglang``/``sglang_row``."""
    groups = by_target(pairs)
    if len(groups) > 1:
        return {"targets": {name: legacy_sglang_document(g) for name, g in groups.items()}}
    part = _document(pairs)
    part["side_by_side"] = [
        {"spec": s["spec"], "kvspec": s["kvspec"], "sglang": s["target"], "sglang_row": s["row"]}
        for s in part["side_by_side"]
    ]
    return part


def verdict(totals: dict[str, Any], pairs: list[SideBySide] | None) -> str:
    """PASS, or FAIL with the failing kvspec cells and real-engine rows."""
    failed_rows = rows_summary([p.row for p in pairs])["failed"] if pairs else 0
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
        groups.setdefault(p.row.target, []).append(p)
    return groups


def rows_word(pairs: Sequence[SideBySide]) -> str:
    """What the rows are called: their one target's name, else "real-engine"."""
    targets = {p.row.target for p in pairs}
    return next(iter(targets)) if len(targets) == 1 else "real-engine"


def failing_rows(pairs: list[SideBySide]) -> Iterator[TargetRow]:
    return (p.row for p in pairs if not p.row.ok)
