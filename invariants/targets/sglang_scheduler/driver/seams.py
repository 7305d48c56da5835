"""What crosses the real scheduler's seams: the trace's ops in (as the release's request objects,
queued until the next iteration's receive), its outputs out (which requests finished, how),
and each iteration's answer (the views of the state it left, and what SGLang's own checkers
said of it).

Keeps: an op reaches SGLang only through ``recv_requests``, exactly where a tokenizer's
requests would arrive; what SGLang sends back is recorded, never acted on. Runs inside the
sglang venv; imports nothing of kvspec.
"""

from __future__ import annotations

import census_deltas
import reader
from reader import END, sglang_rid, trace_rid

PHASES = ("waiting", "running", "chunked", "any")
TICK = 0.001  # simulated seconds per iteration (kvspec's SimClock)


def _marked(submit: dict) -> dict:
    """A submit with its rid (and its session parent's) in SGLang's form."""
    session = submit.get("session")
    if session and session.get("rid"):
        session = dict(session, rid=sglang_rid(session["rid"]))
    return dict(submit, rid=sglang_rid(submit["rid"]), session=session)


class Inputs:
    """The queued inputs, the recorded outputs and the counters of one driven scheduler."""

    def __init__(self, scheduler, adapter) -> None:
        self.scheduler, self.adapter = scheduler, adapter
        self.pending: list = []  # request objects for the next iteration's receive
        self.session_ops = 0  # session opens and closes among them
        self.finished: dict[str, dict] = {}  # rid -> its finish reason (SGLang's dict)
        self.submitted: set[str] = set()
        self.findings: list[str] = []  # SGLang's own checkers, since the last answer
        self.cached_tokens = 0
        self.refused: set[str] = set()  # rids a session refused at submission
        self.clock = 0.0  # simulated seconds: TICK per iteration, plus advance_clock
        self.observe = True  # read views and SGLang's checks at each step
        self.retracts = reader.Retracts(scheduler)
        self.census = census_deltas.CensusEncoder()  # each view's census input as what changed
        self.told = 0  # finished rids an answer has named (``finished`` keeps their order)
        adapter.record_checks(scheduler, self.findings)
        adapter.record_refusals(self.refused)
        adapter.set_clock(lambda: self.clock)

    # ---- in ----

    def apply(self, op: dict, iteration: int) -> tuple[list, object]:
        """A non-step op: its views (none: inputs take effect at the next step) and result."""
        kind, adapter = op["op"], self.adapter
        if kind == "submit":
            self.submitted.add(op["rid"])
            self.pending.append(adapter.generate_input(_marked(op)))
            return [], None
        if kind in ("open_session", "close_session"):
            self.session_ops += 1
            self.pending.append(adapter.session_input(op))
            return [], None
        if kind == "abort":
            rid = op.get("rid") or self.pick(op.get("phase", "any"), op.get("pick", 0))
            if rid is not None:
                self.pending.append(adapter.abort_input(sglang_rid(rid)))
            return [], rid
        if kind == "flush_cache":
            self.pending.append(adapter.flush_input())
            return [], None
        if kind == "advance_clock":
            self.clock += float(op["seconds"])
            return [], None
        return self.query(kind, op, iteration)

    def query(self, kind: str, op: dict, iteration: int) -> tuple[list, object]:
        scheduler = self.scheduler
        if kind == "idle":
            idle = scheduler.is_fully_idle() and not self.pending
            views = [self._view("idle", iteration)] if idle else []
            return views, idle
        if kind == "unfinished":
            return [], [
                rid for rid in op["rids"] if rid in self.submitted and rid not in self.finished
            ]
        if kind == "stats":
            return [], dict(counts=self.counts(iteration))
        raise ValueError(f"unknown op {kind!r}")

    def take_pending(self) -> list:
        """The inputs of the iteration about to run (its clock tick taken first)."""
        self.clock += TICK
        taken, self.pending = self.pending, []
        return taken

    def pick(self, phase: str, pick: int) -> str | None:
        """The ``pick``-th unfinished request in ``phase`` (as SGLang's queues hold them)."""
        if phase not in PHASES:
            raise ValueError(f"abort phase {phase!r}: one of {PHASES}")
        scheduler = self.scheduler
        queues = {
            "waiting": scheduler.waiting_queue,
            "running": scheduler.running_batch.reqs,
            "chunked": [scheduler.chunked_req] if scheduler.chunked_req is not None else [],
            "any": reader.live_requests(scheduler),
        }
        rids = [trace_rid(r) for r in queues[phase] if not r.finished()]
        return rids[pick % len(rids)] if rids else None

    # ---- out ----

    def record(self, output) -> None:
        """One output SGLang sent (a batch of token outputs, a request it ended outside the
        output stream, a session answer, …)."""
        if type(output).__name__ == "AbortReq":  # aborted while queued, or rejected
            reason = getattr(output, "finished_reason", None) or {"type": "abort"}
            self.finished.setdefault(output.rid.removesuffix(END), dict(reason))
            return
        rids = [rid.removesuffix(END) for rid in getattr(output, "rids", None) or []]
        reasons = getattr(output, "finished_reasons", None) or [None] * len(rids)
        cached = getattr(output, "cached_tokens", None) or [0] * len(rids)
        for rid, reason, hit in zip(rids, reasons, cached):
            if reason is not None and rid not in self.finished:
                self.finished[rid] = dict(reason)
                self.cached_tokens += int(hit or 0)

    def step_answer(self, iteration: int) -> dict:
        """The answer to a step: the step view (and a session view when the iteration
        took session ops), SGLang's own checks of the state it left, and the batch it ran
        (``batch``: what kvspec's lockstep compares)."""
        scheduler, adapter = self.scheduler, self.adapter
        if not self.observe:  # the unchecked baseline: SGLang's loop and nothing else
            return dict(views=[], result=None, findings=[], batch=None)
        views = [self._view("step", iteration)]
        failed = scheduler.tp_worker.take_integrity()  # the fake worker's KV reads, if checked
        if failed is not None:  # the step view less its pools (no rule but kv.integrity reads it)
            views.append(dict(views[0], event="forward", pools=[], integrity=failed))
        if self.session_ops:
            self.session_ops = 0
            views.append(dict(views[0], event="session"))
        busy = adapter.busy_check(scheduler) if scheduler.last_batch is not None else None
        found, self.findings[:] = [*self.findings, *([busy] if busy else [])], []
        done, self.told = list(self.finished)[self.told :], len(self.finished)
        ran = reader.batch(scheduler, self.retracts.take(), done)
        return dict(views=views, result=None, findings=found, batch=ran)

    def _view(self, event: str, iteration: int) -> dict:
        refused = frozenset(self.refused)
        view = reader.view(self.scheduler, self.adapter, event, iteration, refused)
        return self.census.encode(view)

    def counts(self, iteration: int) -> dict:
        aborted = sum(1 for r in self.finished.values() if r.get("type") == "abort")
        return dict(
            steps=iteration,
            submitted=len(self.submitted),
            finished=len(self.finished),
            aborted=aborted,
            cached_tokens=self.cached_tokens,
            forwards=self.scheduler.tp_worker.forwards,
            retracted=self.adapter.retracted(self.scheduler),
        )
