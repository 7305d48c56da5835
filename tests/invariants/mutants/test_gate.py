"""`kvspec bugs --gate`: each zoo entry against the default gate — the report's cells in
report order, then explore's seeds — with no trigger written for it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from invariants.mutants.gate import (
    GateResult,
    GateTask,
    gate_entry,
    gate_line,
    gate_tasks,
    run_gate_task,
    summary_line,
    task_hit,
)
from invariants.report.cells import report_cells


def abort_storm_cell() -> GateTask:
    cell = next(c for c in report_cells() if c.name.startswith("abort-storm ps1 "))
    return GateTask(0, cell=cell)


def test_the_gate_runs_the_report_cells_then_the_explore_seeds():
    """The gate's traffic is every report cell in report order, then seeds 0 … n-1; each task
    names its source and the command that replays it."""
    tasks = gate_tasks(seeds=3)
    cells = report_cells()
    assert [t.cell for t in tasks[: len(cells)]] == cells
    assert [t.seed for t in tasks[len(cells) :]] == [0, 1, 2]
    assert [t.index for t in tasks] == list(range(len(tasks)))
    assert tasks[-1].source == "explore seed 2"
    assert tasks[-1].replay == "kvspec explore --seed-start 2 --seeds 1"


def test_a_mutant_is_patched_only_around_its_task():
    """Under the #22273 mutant (an aborted request never released) the abort-storm cell fails
    on ``req.finished_released``; the same cell without it is clean."""
    task = abort_storm_cell()
    hit = run_gate_task("22273-abort-not-released", task)
    assert hit is not None and hit.key == "req.finished_released" and hit.index == 0
    assert task_hit(task, steps=300) is None  # the mutant did not outlive its task


def test_a_false_positive_entry_counts_when_the_old_formula_fires_on_correct_code():
    """#22213's pre-fix busy sum fires on a streaming-session cell of the correct engine."""
    hit = run_gate_task("22213-busy-double-count", abort_storm_cell())
    assert hit is not None and hit.key == "old.busy_sum_counts_borrowed_slots"


def test_a_planted_entry_is_never_reported_as_caught():
    """A planted entry's state is one no trace reaches: the gate says so and runs nothing."""
    with ThreadPoolExecutor(1) as pool:
        result = gate_entry("22900-swa-cursor-uncapped", [], pool, 1, 10)  # type: ignore[arg-type]
    assert result.status == "planted" and result.ok and "no trace" in gate_line(result)


def test_the_verdict_counts_only_entries_a_trace_can_reach():
    """PASS needs every reachable entry caught; a planted one neither passes nor fails it."""
    caught = GateResult(
        "a", "#1", "mutant", "caught", "pool.busy_sum", "cell", "kvspec run x", "", 2.0
    )
    planted = GateResult("b", "#2", "planted", "planted", detail="why")
    missed = GateResult("c", "#3", "mutant", "missed", seconds=9.0, tasks_run=5)
    assert summary_line([caught, planted]).startswith("PASS: the default gate caught 1/1")
    assert summary_line([caught, planted, missed]).startswith("FAIL: the default gate caught 1/2")
    assert gate_line(missed).startswith("MISSED   c: nothing fired in 5 cells and seeds")
    assert "pool.busy_sum after 2.0 s, cell; replay: kvspec run x" in gate_line(caught)
