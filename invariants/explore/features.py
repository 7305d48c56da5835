"""What a run reached, as (event, feature) pairs: the batch shapes the scheduler formed under
the run's configuration, which kinds of request (plain, session, streaming turn) were chunked,
restored, retracted, released or SWA-evicted, what a session close met, and each abort's
phase. The explorer keeps a run that reaches a pair no earlier run did, and the `sometimes`
goals (``REQUIRED``) are pairs the default budget must reach.

Keeps: a probe only reads the engine at events it observes (never writes), so a run's
features are a pure function of its trace; a feature is a short string
``event:what|context`` whose vocabulary is small and fixed (a few hundred pairs), so coverage
counts states worth telling apart, not noise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.request import Req
from invariants.scenarios.ops import Abort, CloseSession, OpenSession, Submit
from invariants.scenarios.trace_run import TraceOutcome

# goal -> (the feature that meets it, what it means); the first six are the original goals
REQUIRED: dict[str, tuple[str, str]] = {
    "retract": ("release:retract", "a running request was retracted"),
    "eviction": ("stats:evicted", "the prefix cache evicted KV to make room"),
    "chunking": ("schedule:chunked", "a prefill was split into chunks"),
    "spec_reject": ("stats:spec_reject", "EAGLE verification rejected a draft token"),
    "session_reuse": ("schedule:stream:restored", "a streaming turn reused its slot's KV"),
    "abort": ("abort:any_phase", "an abort op found a live request and finished it"),
    "retract_session_paged": (
        "release:retract:stream:paged",
        "a streaming turn was retracted at page size > 1",
    ),
    "chunked_session_turn": (
        "schedule:stream:restored:chunked",
        "a streaming turn after the first was prefilled in chunks",
    ),
    "abort_waiting": ("abort:waiting", "an abort found its request waiting"),
    "abort_running": ("abort:running", "an abort found its request running"),
    "abort_mid_chunk": ("abort:chunked", "an abort found its request mid-chunk"),
    "close_retracted_turn": (
        "session:close:retracted_turn",
        "a session closed while its turn waited retracted",
    ),
    "spec_v2_sessions": ("schedule:spec_v2:stream", "EAGLE v2 ran a streaming turn"),
    "swa_evict_sessions": ("step:swa_evict:stream", "a streaming turn slid its SWA window"),
    "session_radix": (
        "schedule:session:radix",
        "a session turn ran with session tags over the radix tree",
    ),
    "turn_one_token": ("schedule:turn:append_one", "a turn appended a single token"),
    "turn_exact_page": ("schedule:turn:append_page", "a turn appended exactly a page (ps > 1)"),
    "turn_empty": ("submit:turn:empty_refused", "a turn with no new tokens was refused (400)"),
    "close_before_turn": ("session:close:before_turn", "a session closed before its first turn"),
}


class FeatureProbe:
    """An engine observer collecting the features of one run (``features``)."""

    __slots__ = ("features",)

    def __init__(self) -> None:
        self.features: set[str] = set()

    def on_event(self, event: str, engine: Any) -> None:
        if event == "schedule":
            self._schedule(engine)
        elif event == "step":
            self._step(engine)
        elif event == "session":
            self._session(engine)

    def _schedule(self, engine: Any) -> None:
        sched, batch = engine.scheduler, engine.scheduler.cur_batch
        if batch is None:
            return
        ctx = context_of(engine)
        add = self.features.add
        add(f"schedule:{batch.mode.value}|{ctx}")
        if batch.chunked_req is not None:
            add("schedule:chunked")
        for req in batch.reqs:
            kind = kind_of(engine, req)
            flags = _flags(engine, req, batch)
            add(f"schedule:{kind}{flags}")
            add(f"schedule:{kind}{flags}|{ctx}")
            if kind == "stream" and sched.policy.spec_mode == "v2":
                add("schedule:spec_v2:stream")
            if kind == "session" and engine.mem.session_refs is not None:
                add("schedule:session:radix")
            record = engine.sessions.records.get(req)
            if record is not None and record.turn > 1:  # the appended input's boundaries
                add(f"schedule:{kind}:append_{_size(record.appended)}|{ctx}")
                add(f"schedule:turn:append_{_page_size_class(record.appended, engine)}")

    def _step(self, engine: Any) -> None:
        sched, add = engine.scheduler, self.features.add
        paged = "paged" if engine.config.memory.page_size > 1 else "token"
        for released in sched.released:
            req = engine.requests.get(released.rid)
            kind = kind_of(engine, req) if req is not None else "gone"
            what = "finish" if released.is_insert else "retract"
            add(f"release:{what}")
            add(f"release:{what}:{kind}:{paged}")
        for req in sched.live_reqs():
            if req.swa_evicted_seqlen > req.cache_protected_len:
                add(f"step:swa_evict:{kind_of(engine, req)}")

    def _session(self, engine: Any) -> None:
        controller = engine.sessions
        for req in engine.scheduler.waiting_queue:
            session = controller.session_of(req)
            if session is None or not req.is_retracted:
                continue
            if session.close_on_finish or session.session_id not in controller.sessions:
                self.features.add("session:close:retracted_turn")


def context_of(engine: Any) -> str:
    """The configuration a batch ran under: page size class, pools, overlap, speculation."""
    cfg = engine.config
    ps = cfg.memory.page_size
    size = "ps1" if ps == 1 else ("ps_small" if ps <= 16 else "ps_large")
    pools = "swa" if cfg.memory.is_hybrid else "full"
    overlap = "overlap" if cfg.enable_overlap else "sync"
    return f"{size}|{pools}|{overlap}|spec_{engine.scheduler.policy.spec_mode}"


def kind_of(engine: Any, req: Req) -> str:
    """stream (a streaming session's turn), session (a plain session's), or plain."""
    session = engine.sessions.session_of(req)
    if session is None:
        return "plain"
    return "stream" if session.streaming else "session"


def _size(n: int) -> str:
    """A length's boundary class: empty, one, few (< 8), many."""
    return "empty" if n == 0 else "one" if n == 1 else "few" if n < 8 else "many"


def _page_size_class(n: int, engine: Any) -> str:
    """one (a token), page (exactly a page, at page size > 1), other."""
    ps = engine.config.memory.page_size
    return "one" if n == 1 else "page" if ps > 1 and n == ps else "other"


def _flags(engine: Any, req: Req, batch: Any) -> str:
    """``:restored`` (a turn reusing its slot's KV), ``:chunked``, ``:resumed`` (after a
    retract), in that order."""
    record = engine.sessions.records.get(req)
    prefix = req.prefix_indices
    restored = record is not None and record.turn > 1 and prefix is not None and len(prefix) > 0
    chunked = req is batch.chunked_req or req.rid in batch.truncated_rids
    return (
        (":restored" if restored else "")
        + (":chunked" if chunked else "")
        + (":resumed" if req.retracted_stain else "")
    )


def outcome_features(outcome: TraceOutcome) -> set[str]:
    """What the run's record says beyond the probe: each abort's phase, an empty turn
    refused, a session closed before its first turn, stats goals."""
    ops, stats, found = outcome.trace.ops, outcome.stats, set[str]()
    turned: set[str] = set()  # sessions that had a turn since they opened
    for result in outcome.results:
        op = ops[result.index] if result.index < len(ops) else None
        if isinstance(op, Abort) and result.status == "ok":
            found.add(f"abort:{op.phase or 'rid'}")
            found.add("abort:any_phase")
        elif isinstance(op, OpenSession):
            turned.discard(op.sid)
        elif isinstance(op, Submit) and op.session is not None:
            turned.add(op.session.id)
            if not op.input_ids and result.status == "rejected":
                found.add("submit:turn:empty_refused")
        elif isinstance(op, CloseSession) and result.status == "ok" and op.sid not in turned:
            found.add("session:close:before_turn")
    if stats.evicted_tokens > 0:
        found.add("stats:evicted")
    if any(stats.spec_accept_hist[:-1]):  # a verify accepted fewer than all drafts
        found.add("stats:spec_reject")
    return found


def goals_of(features: Iterable[str]) -> frozenset[str]:
    """The required goals a set of features meets."""
    have = set(features)
    return frozenset(goal for goal, (feature, _) in REQUIRED.items() if feature in have)


__all__ = ["REQUIRED", "FeatureProbe", "context_of", "goals_of", "kind_of", "outcome_features"]
