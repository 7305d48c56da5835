"""EAGLE v1 and v2 across the feature grid — page sizes 1, 4 and 256, forced retract on and
off, chunked prefill (always: the workload's prompts outgrow the chunk), mixed chunk on
(SGLang turns it off under EAGLE: no mixed batch may form), SWA hybrid pools, radix and chunk
cache — under the whole catalog at level 2 (zero violations), lossless against plain
decoding, every accept length 0..num_steps seen, and each feature proven to have fired."""

from __future__ import annotations

from typing import Any

import pytest

from engine.engine import Engine
from engine.request import SamplingParams
from tests.engine.sched.sched_support import all_pairs, grid_config, run_checked, workload
from tests.engine.speculative.spec_support import eagle_config, tokens

FACTORS = {
    "version": [1, 2],
    "page_size": [1, 4, 256],
    "retract": [False, True],
    "swa": [False, True],
    "mixed": [True, False],
    "radix": [True, False],
}
ROWS = all_pairs(FACTORS)


class SwaWitness:
    """Engine observer: the deepest SWA eviction cursor any live request reached."""

    def __init__(self) -> None:
        self.swa_evicted = 0

    def on_event(self, event: str, engine: Any) -> None:
        if event == "forward":
            self.swa_evicted = max(
                [self.swa_evicted, *(r.swa_evicted_seqlen for r in engine.scheduler.live_reqs())]
            )


def _id(row: dict) -> str:
    return "v{version}-ps{page_size}".format(**row) + "".join(
        f"-{k}" for k in ("retract", "swa", "mixed", "radix") if row[k]
    )


@pytest.mark.parametrize("row", ROWS, ids=[_id(r) for r in ROWS])
def test_eagle_grid_row_is_clean_and_lossless(row: dict) -> None:
    """One all-pairs row: no invariant fires at any event, the output equals plain greedy
    decoding, every accept length occurs, and retract / chunking / SWA eviction fired where
    configured (SWA eviction: below page size 256, where the window spans 512 tokens) while
    no mixed batch formed."""
    w = workload(row["page_size"])
    grid = {k: row[k] for k in ("radix", "mixed", "retract", "swa")}
    witness = SwaWitness()
    engine, checker = run_checked(eagle_config(w, row["version"], **grid), w, observers=(witness,))
    assert checker.violations == []
    s = engine.stats
    assert all(n > 0 for n in s.spec_accept_hist), s.spec_accept_hist
    assert s.chunked_prefills > 0 and s.mixed_batches == 0
    assert s.retracted_reqs > 0 or not row["retract"]
    assert witness.swa_evicted > 0 or not row["swa"] or row["page_size"] == 256  # window 2 pages
    plain = Engine(grid_config(w, overlap=False, radix=True, mixed=False, retract=False))
    expected = plain.generate(
        [list(p) for p in w.prompts], SamplingParams(max_new_tokens=w.max_new_tokens)
    )
    got = [engine.results.get(r.rid) for r in expected]
    assert None not in got and tokens(got) == tokens(expected)
