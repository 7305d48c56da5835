"""The anchor replay drives the same workload the SGLang anchor does: at page size 1 its
counts (timed steps, prefix hits, evicted tokens) equal the anchor's published ones."""

from __future__ import annotations

from invariants.bench.anchor import compare, run_once


def test_anchor_replay_matches_sglang_counts_at_page_size_1() -> None:
    """The anchor workload at page size 1, batch 8 gives SGLang 0.5.23's own counts (its driver:
    targets/sglang/driver/anchor.py): 1838 timed steps, 85760 hit, 126700 evicted."""
    row = run_once(page_size=1, batch=8, seed=0)
    assert (row["steps_timed"], row["hit_tokens"], row["evicted_tokens"]) == (1838, 85760, 126700)


def test_checked_anchor_run_is_clean() -> None:
    """With the census checked after every step (level 2) the replay raises nothing."""
    row = run_once(page_size=16, batch=8, seed=0, check="census")
    assert row["steps_timed"] > 0


def test_compare_pairs_cells_and_computes_ratios() -> None:
    """Ratios are kvspec ÷ SGLang per (page size, batch) cell present in both."""
    ours = [
        {
            "page_size": 1,
            "batch": 8,
            "steps_per_s": 200.0,
            "conservation_check_us_per_step": 1.0,
            "census_check_us_per_step": 2.0,
            "steps_timed": 5,
            "hit_tokens": 6,
            "evicted_tokens": 7,
        }
    ]
    theirs = {
        "results": [
            {
                "page_size": 1,
                "batch": 8,
                "steps_per_s": {"median": 100.0},
                "steps_timed": 5,
                "hit_tokens": 6,
                "evicted_tokens": 7,
            }
        ]
    }
    (row,) = compare(ours, theirs)
    assert row["speed_ratio"] == 2.0 and row["steps_timed"] == [5, 5]
