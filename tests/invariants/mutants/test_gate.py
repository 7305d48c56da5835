"""`kvspec bugs --gate`: each zoo entry against the default gate — the report's cells and the
default explore campaign's runs, interleaved — with no trigger written for it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from invariants.explore.campaign import Run
from invariants.mutants.gate import (
    NO_STATE_EFFECT,
    GateResult,
    gate_entry,
    gate_line,
    summary_line,
)
from invariants.mutants.gate_traffic import GateTask, GateTraffic, run_gate_task, task_hit
from invariants.report.cells import report_cells


def abort_storm_cell() -> GateTask:
    cell = next(c for c in report_cells() if c.name.startswith("abort-storm ps1 "))
    return GateTask(0, cell=cell)


def test_the_traffic_interleaves_report_cells_and_campaign_runs():
    """Units alternate between the next report cell and the next campaign run; a new
    generation of runs is drawn only once the last one's results are all back."""
    cells = report_cells()[:3]
    traffic = GateTraffic(seeds=2, steps=30, cells=cells)
    first = [traffic.next_task() for _ in range(4)]
    assert [t.run is not None for t in first if t] == [True, False, True, False]
    assert [t.index for t in first if t] == [0, 1, 2, 3]
    assert traffic.next_task() is not None and traffic.next_task() is None  # the last cell
    assert first[0] is not None and first[0].source == "explore seed 0"
    assert first[0].replay == "kvspec explore --seed-start 0 --seeds 1"
    for task in (first[0], first[2]):
        assert task is not None and task.run is not None
        traffic.done(task_hit(task, 30)[1])
    assert traffic.exhausted


def test_a_mutant_is_patched_only_around_its_task():
    """Under the #22273 mutant (an aborted request never released) the abort-storm cell fails
    on ``req.finished_released``; the same cell without it is clean."""
    task = abort_storm_cell()
    hit, record = run_gate_task("22273-abort-not-released", task, 300)
    assert hit is not None and hit.key == "req.finished_released" and record is None
    assert task_hit(task, steps=300) == (None, None)  # the mutant did not outlive its task


def test_a_campaign_run_reports_its_record_to_the_traffic():
    """A run gives the campaign its record (features, arcs) whether or not it found anything."""
    hit, record = task_hit(GateTask(0, run=Run(0, 3)), 60)
    assert hit is None and record is not None and record.name == "seed 3" and record.features


def test_a_false_positive_entry_counts_when_the_old_formula_fires_on_correct_code():
    """#22213's pre-fix busy sum fires on a streaming-session cell of the correct engine."""
    hit, _ = run_gate_task("22213-busy-double-count", abort_storm_cell(), 300)
    assert hit is not None and hit.key == "old.busy_sum_counts_borrowed_slots"


def test_a_planted_entry_is_never_reported_as_caught():
    """A planted entry's state is one no trace reaches: the gate says so and runs nothing."""
    traffic = GateTraffic(seeds=1, steps=10, cells=[])
    with ThreadPoolExecutor(1) as pool:
        result = gate_entry("22900-swa-cursor-uncapped", traffic, pool, 1, 10)
    assert result.status == "planted" and result.ok and "no trace" in gate_line(result)
    assert traffic.next_task() is not None  # nothing was issued


def test_the_verdict_counts_only_entries_a_trace_can_reach():
    """PASS needs every reachable entry with a state effect caught; a planted one, or a probe
    entry no shipped rule can see (unseen), neither passes nor fails it, and says why."""
    caught = GateResult(
        "a", "#1", "mutant", "caught", "pool.busy_sum", "cell", "kvspec run x", "", 2.0
    )
    planted = GateResult("b", "#2", "planted", "planted", detail="why")
    missed = GateResult("c", "#3", "mutant", "missed", seconds=9.0, tasks_run=5)
    assert summary_line([caught, planted]).startswith("PASS: the default gate caught 1/1")
    assert summary_line([caught, planted, missed]).startswith("FAIL: the default gate caught 1/2")
    unseen = GateResult("d", "#4", "probe", "unseen", detail=NO_STATE_EFFECT, tasks_run=7)
    assert summary_line([caught, unseen]).startswith("PASS: the default gate caught 1/1")
    assert "1 without a state effect" in summary_line([caught, unseen])
    assert gate_line(unseen) == f"unseen   d: {NO_STATE_EFFECT} (7 cells and runs)"
    assert gate_line(missed).startswith("MISSED   c: nothing fired in 5 cells and runs")
    assert "pool.busy_sum after 2.0 s, cell; replay: kvspec run x" in gate_line(caught)
