"""A driver's JSON views → kvspec StateView objects, with the census computed on this side.

Keeps: counters and census stay apart (docs/design.md, *Counters vs census*) on every target —
the pool counters are the engine's own (its driver reads them), while the census is computed
here by ``take_census`` from the raw page ids each owner references, so a counter that
balances over a double-owned or leaked page is still caught, by page id and owner.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.observe.census import take_census
from engine.view import POOL_BUCKETS, PoolView, StateView, view_to_dict
from invariants.checking.schema import build_view, unknown_view_keys


def _census(raw: dict[str, Any], page_size: int) -> dict[str, Any]:
    """The census of one pool's input; its owners list one id per slot held unless the input
    says how many equal ids in a row one holding lists (``slots_per_page``: 1 where a driver
    lists each block once per holding, as vLLM's does — a block twice in a row in one table
    is then held twice, not one holding of two slots)."""
    page_size = raw.get("slots_per_page", page_size)
    owned = [(label, np.asarray(pages, dtype=np.int64)) for label, pages in raw["owned"]]
    referenced = [(label, np.asarray(pages, dtype=np.int64)) for label, pages in raw["referenced"]]
    free = np.asarray(raw["free_pages"], dtype=np.int64)
    return view_to_dict(
        take_census(raw["num_pages"], free, owned, referenced, slots_per_page=page_size)
    )


def to_state_view(raw: dict[str, Any]) -> StateView:
    """One driver view as a StateView; unknown keys are an error naming the key."""
    data = dict(raw)
    data["pools"] = [
        {
            **{k: v for k, v in pool.items() if k != "census_input"},
            "census": _census(pool["census_input"], pool.get("page_size", 1)),
        }
        for pool in raw["pools"]
    ]
    problems = [f"{'.'.join(map(str, loc))}: {reason}" for loc, reason in unknown_view_keys(data)]
    if problems:
        raise ValueError("a driver view does not fit engine/view.py: " + "; ".join(problems))
    return build_view(data, data.get("event", "step"))


def pool_buckets(pool: PoolView) -> dict[str, int]:
    """The five ownership buckets of one pool (what differential mode compares)."""
    return {name: getattr(pool, name) for name in POOL_BUCKETS}


def buckets(view: StateView) -> dict[str, int]:
    """The five ownership buckets of the full pool."""
    return pool_buckets(view.pools[0])
