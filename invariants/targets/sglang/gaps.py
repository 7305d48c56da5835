"""Where kvspec deliberately differs from SGLang 0.5.23: one list, each with its reason.

Keeps: differential mode classifies every per-step bucket difference as declared (a gap
below applies to the configuration and the pool, names that bucket, keeps the sum of its
buckets equal on both targets and satisfies its bound) or unexpected (a finding). Line
numbers cite the 0.5.23 wheel (``sglang/srt/…``) and the 0.5.11 wheel kvspec's engine follows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Row = dict[str, int]


def _no_bound(ours: Row, theirs: Row, allowance: int) -> bool:
    return True


def _no_excess(ours: Row, theirs: Row) -> int:
    return 0


@dataclass(frozen=True, slots=True)
class Gap:
    """One deliberate difference: the buckets it moves, whose sum it must keep equal on both
    targets (else the difference is not this gap), the pools it may appear in, when it
    applies, and a bound on the direction of the move (ours, theirs: one pool's buckets;
    allowance: the held tokens the other gaps moving with it explain, their ``excess``)."""

    id: str
    buckets: tuple[str, ...]
    reason: str
    applies: Callable[[dict[str, Any]], bool]
    pools: tuple[str, ...] = ("full", "swa")
    bound: Callable[[Row, Row, int], bool] = _no_bound
    excess: Callable[[Row, Row], int] = _no_excess  # tokens it lets SGLang hold beyond kvspec


def _swa(config: dict[str, Any]) -> bool:
    return bool(config.get("sliding_window"))


def _held(row: Row) -> int:
    """Tokens of a pool nothing can reclaim (locked in the tree, or in a row)."""
    return row["protected"] + row["request_owned"] + row["session_held"]


def _rows(row: Row) -> int:
    """Tokens of a pool request and session rows own (outside the tree)."""
    return row["request_owned"] + row["session_held"]


GAPS: tuple[Gap, ...] = (
    Gap(
        "eviction.amount",
        ("free", "evictable"),
        "how much an allocation evicts when the pool is short: kvspec follows SGLang 0.5.11 "
        "(alloc_token_slots evicts the whole extend at page size 1); 0.5.23's evict_for_alloc "
        "evicts the shortfall only at page size 1, and the shortfall plus per-request page "
        "padding at page size > 1 (docs/benchmarks.md). Tokens move between free and evictable; "
        "their sum is the same on both targets",
        lambda config: True,
    ),
    Gap(
        "session.borrowed_row_is_request_owned",
        ("session_held", "request_owned"),
        "kvspec counts a session row lent to its running turn as request-owned (held slots "
        "exclude active rows, docs/sglang.md §2.2, #22213); 0.5.23 counts every session "
        "record as session-held, including while a turn runs on it",
        lambda config: bool(config.get("sessions")),
    ),
    Gap(
        "swa.window_only_at_checkpoint",
        ("free", "evictable", "protected", "request_owned"),
        "0.5.23 keeps only the window of a checkpointed request's SWA KV: "
        "UnifiedRadixCache.checkpoint_into_tree (mem_cache/unified_radix_cache.py:1211-1221, "
        "on by default: SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS, environ.py:728) calls "
        "SWAComponent.free_out_of_window_slots (unified_cache/components/swa.py:1043) -> "
        "free_swa_out_of_window_slots (mem_cache/common.py:75), which frees the SWA KV below "
        "pre_len - ceil(window, page) right after the prefill, and the insert stores it as "
        "tombstone; the insert also splits a fresh leaf at one window (_populate_range -> "
        "_maybe_split_leaf_for_swa_lock, swa.py:529, 593), so the SWA lock "
        "(acquire_component_lock, swa.py:849) pins one window, not the whole prompt. kvspec "
        "follows 0.5.11 (docs/sglang.md §1.5, §2.3 rule 6): SWARadixCache.cache_unfinished_req "
        "(swa_radix_cache.py:477) inserts the prompt with live SWA KV, inc_lock_ref (:640) "
        "SWA-locks whole nodes until the window is covered, and SWA KV is freed only by "
        "decode's _evict_swa (schedule_batch.py:2651), cursor first raised to "
        "cache_protected_len. SWA pool only: tokens move from protected/request-owned to "
        "free/evictable; the four buckets keep their sum, and SGLang never holds more SWA "
        "(protected + request_owned + session_held) than kvspec, save what its rows keep "
        "longer between evictions (swa.eviction_cadence below)",
        _swa,
        pools=("swa",),
        bound=lambda ours, theirs, allowance: _held(theirs) - _held(ours) <= allowance,
    ),
    Gap(
        "swa.eviction_cadence",
        ("free", "session_held", "request_owned"),
        "when a running request's out-of-window SWA KV is freed: 0.5.23 gates it per request on "
        "tokens, evicting only once SGLANG_SWA_EVICTION_INTERVAL (128, environ.py:730) tokens "
        "have slid out of the window past the last cursor (ScheduleBatch._swa_eviction_trigger, "
        "managers/schedule_batch.py:4047-4066; maybe_evict_swa :4068, its decode_batch_idx >= 1 "
        "guard :4087; the same gate in free_swa_out_of_window_slots, mem_cache/common.py:98); "
        "0.5.11 evicts on a decode-step cadence, every window's decode steps "
        "(decode_batch_idx % eviction_interval == 1, docs/sglang.md §2.3 rule 6 and "
        "§5 #20070), "
        "and so does kvspec (engine/sched/batch.py prepare_for_decode). Between evictions "
        "SGLang's rows (a running request's, or a streaming session's slot) keep up to the "
        "interval plus a page of SWA KV that kvspec has freed. SWA pool only: tokens move from "
        "free to request_owned/session_held, never the other way; the three keep their sum",
        _swa,
        pools=("swa",),
        bound=lambda ours, theirs, allowance: _rows(theirs) >= _rows(ours),
        excess=lambda ours, theirs: _rows(theirs) - _rows(ours),
    ),
    Gap(
        "swa.branch_insert_stops_at_live_window",
        ("protected", "request_owned"),
        "a consequence of the gap above in the full pool: 0.5.23's match records "
        "swa_branching_seqlen when the full-KV hit runs past the last live SWA window "
        "(SWAComponent.finalize_match_result_in_tree_core, swa.py:379; match_kv_cache, "
        "common.py:262), and the request's next checkpoint inserts only up to that point "
        "(prepare_for_caching_req caps the insert, swa.py:999-1028), so the rest of a prompt "
        "that shares a tombstoned prefix stays request-owned until its release; 0.5.11 has no "
        "SWA branching (cache_unfinished_req inserts the whole page-aligned fill, "
        "swa_radix_cache.py:477), nor does kvspec. Full pool of an SWA hybrid only: tokens move "
        "from protected to request_owned, never the other way; their sum is the same",
        _swa,
        pools=("full",),
        bound=lambda ours, theirs, allowance: theirs["request_owned"] >= ours["request_owned"],
    ),
)


def _balanced(ours: Row, theirs: Row, buckets: tuple[str, ...]) -> bool:
    return sum(ours[b] for b in buckets) == sum(theirs[b] for b in buckets)


def _joint(bucket: str, gaps: list[Gap]) -> list[Gap]:
    """The gaps whose bucket sets chain to ``bucket`` through shared buckets: together they
    allow any sum-preserving move over the union of their buckets."""
    joint, reach = [], {bucket}
    grown = True
    while grown:
        grown = False
        for gap in gaps:
            if gap not in joint and reach & set(gap.buckets):
                joint.append(gap)
                reach |= set(gap.buckets)
                grown = True
    return joint


def declared(
    ours: Row, theirs: Row, bucket: str, config: dict[str, Any], pool: str = "full"
) -> Gap | None:
    """The gap that declares a difference in ``bucket`` of ``pool`` at one step (None: a
    finding); ``ours``/``theirs``: that pool's buckets on kvspec and on SGLang. Gaps that
    share buckets and move at once (an SWA session turn) declare it jointly — the fewest
    that do: one Gap whose id joins theirs, balanced over the union of their buckets, each
    within its bound given what the others explain."""
    live = [gap for gap in GAPS if pool in gap.pools and gap.applies(config)]
    for size in range(1, len(live) + 1):
        for group in itertools.combinations(live, size):
            allowance = sum(gap.excess(ours, theirs) for gap in group)
            if not all(gap.bound(ours, theirs, allowance) for gap in group):
                continue
            union = tuple(dict.fromkeys(b for gap in group for b in gap.buckets))
            if len(_joint(bucket, list(group))) == size and _balanced(ours, theirs, union):
                if size == 1:
                    return group[0]
                return Gap(
                    "+".join(gap.id for gap in group),
                    union,
                    " AND ".join(gap.reason for gap in group),
                    lambda config: True,
                    (pool,),
                )
    return None
