"""Where kvspec's scheduler deliberately differs from SGLang's real one: one list, each gap
with the aspects of an iteration it explains, the releases it was established on, the narrow
situation it applies to, and its reason.

Keeps: a gap is a predicate over one paired iteration (the op in flight, both sides'
records, the configuration, what earlier gaps explained), never a blanket over an aspect —
the same aspect differing outside the gap's situation is still the divergence. Batch gaps
are matched aspect by aspect; the pool's buckets are explained jointly (``pool_gaps``), by
moves each gap bounds, so that two gaps moving tokens at once still sum to what is seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from engine.view import POOL_BUCKETS
from invariants.scenarios.ops import Idle, Op
from invariants.targets.sglang_scheduler.lockstep_records import Batch, Iteration

BORROWED_ROW = "session.borrowed_row_is_request_owned"  # invariants/targets/sglang/gaps.py's
STAND_IN_KV = "session.refused_stand_in_prefill"


@dataclass(slots=True)
class Ledger:
    """What the run has seen that later gaps are bounded by: the rids kvspec rejected at
    submission, the rids whose last decode 0.5.23 skipped, and the refused rids SGLang ran
    a stand-in prefill for."""

    rejected: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)
    stand_ins: set[str] = field(default_factory=set)


class Situation(NamedTuple):
    """One paired iteration: the op in flight (None: the drain), each side's record (None:
    that side ran no iteration there), the configuration, SGLang's latest iteration before
    this one, the release, the run's ledger, and kvspec's iteration before this one."""

    op: Op | None
    kvspec: Iteration | None
    sglang: Iteration | None
    config: dict[str, Any]
    sglang_before: Iteration | None = None
    version: str = ""
    ledger: Ledger = Ledger()
    kvspec_before: Iteration | None = None


@dataclass(frozen=True, slots=True)
class SchedGap:
    """One deliberate difference of the schedulers (``applies``: None for a pool gap, whose
    moves ``pool_gaps`` bounds)."""

    id: str
    aspects: tuple[str, ...]
    reason: str
    applies: Callable[[Situation], bool] | None = None
    releases: tuple[str, ...] = ()  # the releases it was established on (empty: every one)
    needs: str = ""  # the config key that must be on for it to apply
    note: Callable[[Situation], None] | None = None  # what applying it adds to the ledger

    def available(self, s: Situation) -> bool:
        release = not self.releases or s.version in self.releases
        return release and (not self.needs or bool(s.config.get(self.needs)))


def _both(s: Situation) -> tuple[Iteration, Iteration] | None:
    return None if s.kvspec is None or s.sglang is None else (s.kvspec, s.sglang)


def _skips_finishing(s: Situation) -> bool:
    """SGLang's batch is kvspec's less decoding requests (one token each) that kvspec
    finished in the same iteration: the in-flight result it processed finished them."""
    if (pair := _both(s)) is None:
        return False
    mine, their = dict(pair[0].batch.reqs), dict(pair[1].batch.reqs)
    extra = set(mine) - set(their)
    modes = {"decode": ("decode", "idle"), "mixed": ("mixed", "extend")}
    return (
        pair[1].batch.mode in modes.get(pair[0].batch.mode, ())
        and bool(extra)
        and all(mine.get(rid) == n for rid, n in their.items())
        and all(mine[rid] == 1 for rid in extra)
        and extra <= set(pair[0].batch.finished)
    )


def _turn_after_skip(s: Situation) -> bool:
    """The same requests; each turn appended to a request whose last decode 0.5.23 skipped
    extends one token less on kvspec; the batch's last request (the one the chunk budget
    cuts, page-aligned, so it gets what the others left) may differ with them, or as such
    a turn itself."""
    if (pair := _both(s)) is None or pair[0].batch.rids != pair[1].batch.rids:
        return False
    mine, their = dict(pair[0].batch.reqs), dict(pair[1].batch.reqs)
    parents, last = s.config.get("parents", {}), pair[0].batch.reqs[-1][0]
    after = {rid for rid in mine if parents.get(rid) in s.ledger.skipped}
    changed = {rid for rid in mine if mine[rid] != their[rid]}
    others = changed - {last}
    if not all(rid in after and their[rid] - mine[rid] == 1 for rid in others):
        return False
    return bool(others) or (last in changed and last in after)


def _note_skipped(s: Situation) -> None:
    if (pair := _both(s)) is not None:
        s.ledger.skipped.update(pair[0].batch.rids - pair[1].batch.rids)


def _stand_ins(s: Situation) -> bool:
    """SGLang's batch is kvspec's plus one-token prefills of requests kvspec rejected at
    submission; what else differs (new tokens) is declared by another gap."""
    if (pair := _both(s)) is None:
        return False
    mine, their = pair[0].batch, pair[1].batch
    extra = their.rids - mine.rids
    if not extra or not extra <= s.ledger.rejected or mine.rids - their.rids:
        return False
    if any(n != 1 for rid, n in their.reqs if rid in extra):
        return False
    rest = their._replace(reqs=tuple((rid, n) for rid, n in their.reqs if rid not in extra))
    reduced = s._replace(sglang=pair[1]._replace(batch=rest))
    same = dict(rest.reqs) == dict(mine.reqs) and (mine.mode == rest.mode or not rest.reqs)
    return same or sched_gap("tokens", reduced) is not None


def _note_stand_ins(s: Situation) -> None:
    if (pair := _both(s)) is not None:
        s.ledger.stand_ins.update(pair[1].batch.rids - pair[0].batch.rids)


def _idle_probe(s: Situation) -> bool:
    """kvspec's extra iteration at the end of a wait for idle: nothing ran or was retracted
    in it, and it left the buckets as its own iteration before (compared already)."""
    ours, before = s.kvspec, s.kvspec_before
    return (
        (s.op is None or isinstance(s.op, Idle))
        and s.sglang is None
        and ours is not None
        and ours.batch == Batch("idle")
        and before is not None
        and ours.buckets == before.buckets
    )


SKIP_FINISHING = SchedGap(
    "overlap.skip_finishing_decode",
    ("requests", "mode"),
    "0.5.23's overlap loop leaves out of the next decode (or a mixed batch's decode part) "
    "the requests whose in-flight result finishes them by length "
    "(Scheduler._reqs_finishing_inflight, managers/scheduler.py:4444, first thing in "
    "update_running_batch); kvspec follows 0.5.11 (engine/sched/scheduler.py: N+1 is "
    "prepared before N's tokens are seen), decoding them once more and dropping that token "
    "at their release in the same iteration",
    _skips_finishing,
    ("0.5.23",),
    "overlap",
    _note_skipped,
)
CACHED_LAST_TOKEN = SchedGap(
    "overlap.finished_last_token_cached",
    POOL_BUCKETS,
    "the pool side of overlap.skip_finishing_decode: the extra decode kvspec ran wrote the "
    "KV of the request's last output token, and its release keeps it (committed covers "
    "it: in the cache, where a later request may lock it, or in a streaming session's "
    "slot), where 0.5.23 never wrote it. kvspec holds more tokens than SGLang (in no "
    "bucket fewer), at most a page per skipped decode, and has as much less free",
    None,
    ("0.5.23",),
    "overlap",
)
TURN1_CHUNKS = SchedGap(
    "session.turn1_chunks_published",
    ("protected", "session_held", "request_owned"),
    "a streaming session's first turn, prefilled in chunks: 0.5.23's slot publishes the "
    "prompt chunk by chunk (StreamingSession.try_checkpoint, session/streaming_session.py:"
    "194: publishes_prompt, checkpoint_into_tree, the lock moved to the slot), so each chunk "
    "is tree-protected at once; kvspec follows #20476 (engine/cache/streaming_session.py "
    "cache_unfinished_req): a streaming turn's chunk stash keeps the row as the prefix and "
    "skips the tree, so those tokens stay in the turn's row until the prompt is inserted "
    "whole. Tokens move from kvspec's rows to SGLang's protected part, never the other way",
    None,
    ("0.5.23",),
    "streaming",
)
SCHED_GAPS: tuple[SchedGap, ...] = (
    SKIP_FINISHING,
    SchedGap(
        "overlap.next_turn_extends_one_less",
        ("tokens",),
        "the batch side of overlap.finished_last_token_cached for a session: the turn "
        "appended to a request whose last decode 0.5.23 skipped finds that token's KV on "
        "kvspec (in the slot, or the tree) and extends one token less; a chunked batch's "
        "last request then gets what the others left of the chunk budget",
        _turn_after_skip,
        ("0.5.23",),
        "overlap",
    ),
    CACHED_LAST_TOKEN,
    TURN1_CHUNKS,
    SchedGap(
        "session.refused_stand_in_prefill",
        ("requests", "mode"),
        "a request its session refuses (bad session parameters, a streaming session with a "
        "turn in flight): kvspec answers it at submission (engine/sched/sessions.py: every "
        "rejection an abort with status 400, no memory touched); SGLang's Session.create_req "
        "returns it already aborted and the scheduler still queues it, prefilling a one-token "
        "stand-in in the next batch (and, under overlap, decodes it once in the batch after) "
        "before answering it (the driver's view: "
        "driver/reader.py view, ``refused``)",
        _stand_ins,
        note=_note_stand_ins,
    ),
    SchedGap(
        "drain.idle_probe",
        ("iterations",),
        "a wait for idle ends differently: kvspec's run_until_idle steps until an iteration "
        "has nothing to launch and nothing to process (engine/engine.py: it declares idle "
        "from the iteration's outcome), while the target asks SGLang's is_fully_idle between "
        "iterations, which holds as soon as the last result was processed; kvspec then runs "
        "one more iteration (two under overlap: one to process the last batch's result, one "
        "to find nothing), each empty and leaving the pool as it was",
        _idle_probe,
    ),
)


def sched_gap(aspect: str, situation: Situation) -> SchedGap | None:
    """The batch gap that declares ``aspect``'s difference in ``situation`` (None: none)."""
    for gap in SCHED_GAPS:
        if gap.applies is None or aspect not in gap.aspects or not gap.available(situation):
            continue
        if gap.applies(situation):
            return gap
    return None


def pool_gaps(s: Situation) -> tuple[str, ...] | None:
    """The gaps that jointly explain the buckets' difference (None: they do not). With
    d = kvspec - SGLang per bucket, the rows (session-held + request-owned) taken together
    (BORROWED_ROW moves tokens between the two when sessions run), and B a page per decode
    0.5.23 skipped so far (0 where CACHED_LAST_TOKEN does not apply):

        x = -d.free in [0, B]   tokens kvspec holds beyond SGLang     CACHED_LAST_TOKEN
        d.evictable >= 0        kvspec's cache keeps them, or ...
        d.rows >= -B            ... a later turn matched one (protected on kvspec, the
                                turn's row on SGLang: overlap.next_turn_extends_one_less)
        d.protected >= -Y       Y unbounded where TURN1_CHUNKS applies, else 0

    and each bound loosened by R, two pages per stand-in SGLang ran for a refused request
    (its prefill's and its one decode's KV, and what its release caches, are SGLang's only).
    """
    if (pair := _both(s)) is None:
        return None
    d = {k: pair[0].buckets[k] - pair[1].buckets[k] for k in POOL_BUCKETS}
    rows, extra = d["session_held"] + d["request_owned"], -d["free"]
    skipped = len(s.ledger.skipped) if CACHED_LAST_TOKEN.available(s) else 0
    # a stand-in holds a page for its prefill, and one more for the decode overlap gives it
    bound, stand_ins = (n * s.config["page_size"] for n in (skipped, 2 * len(s.ledger.stand_ins)))
    chunks = TURN1_CHUNKS.available(s)
    if not (-stand_ins <= extra <= bound and d["evictable"] >= -stand_ins):
        return None
    if rows < -bound - stand_ins or (d["protected"] < -stand_ins and not chunks):
        return None
    if d["session_held"] and not s.config["sessions"]:
        return None
    used = [CACHED_LAST_TOKEN.id] if extra > 0 or rows < 0 < bound else []
    used += [STAND_IN_KV] if stand_ins and min(extra, d["evictable"], d["protected"]) < 0 else []
    used += [TURN1_CHUNKS.id] if d["protected"] < -stand_ins else []
    return (*used, *([BORROWED_ROW] if d["session_held"] else []))
