"""The engine explorer (`kvspec explore`, `kvspec replay`): seed-driven simulation of the
whole engine (docs/gate.md: FoundationDB's seeded simulation, swarm testing, delta debugging).

Keeps: one seed → one swarm configuration → one trace → one outcome; a run that reaches
something new is kept and mutated; a failure is shrunk (delta debugging, same failure key) and
written as a JSON trace that `kvspec replay` reproduces. Modules: swarm.py (per-seed
configuration and op mix), generate.py (the trace: safety → drain → idle), features.py
((event, feature) pairs and the `sometimes` goals), branches.py (the engine arcs a run
executed), mutate.py (mutants of a kept trace), campaign.py (fresh seeds, then generations of
mutants; the corpus), ddmin.py (`shrink`), explorer.py (a run, a shrink, a finding),
streamed.py (the campaign on a fleet of workers, journaled as it goes: `--resume`),
parallel.py (a spawn pool for the report's and the gate's work), replay.py (first violation
and the state-view diff), report.py (the printed report and its JSON).
"""

from invariants.explore.ddmin import shrink
from invariants.explore.explorer import (
    DEFAULT_SEEDS,
    DEFAULT_STEPS,
    FAILURE_DIR,
    ExploreReport,
    Finding,
    fails_like,
    failure_key,
    run_seed,
)
from invariants.explore.generate import generate_trace
from invariants.explore.replay import Replay, replay, view_diff
from invariants.explore.streamed import explore, resume

__all__ = [
    "DEFAULT_SEEDS",
    "DEFAULT_STEPS",
    "FAILURE_DIR",
    "ExploreReport",
    "Finding",
    "Replay",
    "explore",
    "fails_like",
    "failure_key",
    "generate_trace",
    "replay",
    "resume",
    "run_seed",
    "shrink",
    "view_diff",
]
