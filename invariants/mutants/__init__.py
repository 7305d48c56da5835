"""The bug zoo: every historical SGLang bug of docs/sglang.md §5 (and the §2.9 gaps a
mutant can plant) as a named entry — an engine mutant with the trigger that shows it; for a
checker bug, the pre-fix formula that fires on correct code; for a bug whose precondition no
trace reaches in kvspec's engine, the state planted by hand (invariants/mutants/planted.py).

Keeps: one definition of each bug (tests and ``kvspec bugs`` both take it from ``ZOO``);
names are unique; every trigger and old-rules file lives under specs/bugs/.
"""

from __future__ import annotations

from invariants.mutants import penalties, sched, session, session_radix, speculative
from invariants.mutants.base import BUGS_DIR, Entry, FalsePositive, Mutant, Planted, ids, swap
from invariants.mutants.planted import PLANTED

FALSE_POSITIVES: tuple[FalsePositive, ...] = (
    FalsePositive(
        "22213-busy-double-count",
        "sglang#22213",
        "pre-#22213 busy check counts a borrowed slot as session-held and as uncached",
        "22213-busy-double-count.rules.yaml",
        "22213-busy-double-count.json",
        ids("old.busy_sum_counts_borrowed_slots"),
    ),
    FalsePositive(
        "20070-idle-formula",
        "sglang#20070",
        "pre-#20070 idle checks ignore session-held KV and the turn-1 lock, use raw lengths",
        "20070-idle-formula.rules.yaml",
        "20070-idle-formula.json",
        ids("old.hybrid_idle_num_used_zero", "old.idle_held_raw_allocated"),
    ),
    FalsePositive(
        "20476-reuse-one-row-per-batch",
        "sglang#20476",
        "0.5.9 pool assert: one request per batch may arrive with a row (restored turns do)",
        "20476-reuse-one-row-per-batch.rules.yaml",
        "20476-reuse-one-row-per-batch.json",
        ids("old.one_reusing_request_per_batch"),
    ),
)

ZOO: tuple[Entry, ...] = (
    *session.MUTANTS,
    *session_radix.MUTANTS,
    *sched.MUTANTS,
    *speculative.MUTANTS,
    *penalties.MUTANTS,
    *PLANTED,
    *FALSE_POSITIVES,
)
BY_NAME: dict[str, Entry] = {e.name: e for e in ZOO}
if len(BY_NAME) != len(ZOO):
    raise ValueError("bug zoo: duplicate entry names")


def entry(name: str) -> Entry:
    """The zoo entry ``name``; the error lists the known names."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no bug zoo entry {name!r}; known: {', '.join(sorted(BY_NAME))}") from None


def mutant(name: str) -> Mutant:
    found = entry(name)
    if not isinstance(found, Mutant):
        raise TypeError(f"{name} is a {found.kind} entry, not an engine mutant")
    return found


__all__ = [
    "BUGS_DIR",
    "BY_NAME",
    "FALSE_POSITIVES",
    "PLANTED",
    "ZOO",
    "Entry",
    "FalsePositive",
    "Mutant",
    "Planted",
    "entry",
    "mutant",
    "swap",
]
