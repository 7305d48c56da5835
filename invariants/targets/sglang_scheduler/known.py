"""Known divergences of kvspec's scheduler from SGLang's real one: differences whose cause is
established but that no gap can declare, since they shift the schedules for good (a request
admitted an iteration apart changes every batch after it). A divergence that matches one is
printed with its likely cause; it still ends the run and still fails it.

Keeps: a recognizer reads only the divergence's own iteration pair and SGLang's iteration
before it, and names a cause, never a verdict: the first divergence of a run stays a
finding for a person to judge (kvspec's fidelity, or SGLang's change).
"""

from __future__ import annotations

from invariants.targets.sglang_scheduler.gaps import SchedGap, Situation


def _refilled_early(s: Situation) -> bool:
    """SGLang admits new requests where kvspec decodes, right after requests finished."""
    ours, theirs, before = s.kvspec, s.sglang, s.sglang_before
    if ours is None or theirs is None or before is None:
        return False
    return (
        ours.batch.mode == "decode"
        and theirs.batch.mode in ("extend", "mixed")
        and bool(theirs.batch.rids - ours.batch.rids)
        and bool(before.batch.finished)
    )


def _admits_more(s: Situation) -> bool:
    """kvspec admits requests SGLang leaves waiting (SGLang decodes, or admits a subset),
    the trace's requests ignoring EOS."""
    ours, theirs = s.kvspec, s.sglang
    if ours is None or theirs is None or not s.config.get("ignore_eos"):
        return False
    a, b = ours.batch, theirs.batch
    fewer = b.mode == "decode" or (b.mode in ("extend", "mixed") and b.rids < a.rids)
    return a.mode in ("extend", "mixed") and bool(a.rids - b.rids) and fewer


def _turn_refused_by_sglang(s: Situation) -> bool:
    """SGLang runs a one-token stand-in for a session turn kvspec prefills for real."""
    ours, theirs = s.kvspec, s.sglang
    if ours is None or theirs is None:
        return False
    mine, their = dict(ours.batch.reqs), dict(theirs.batch.reqs)
    turns = s.config.get("parents", {})
    return any(their.get(rid) == 1 < n and rid in turns for rid, n in mine.items())


KNOWN: tuple[SchedGap, ...] = (
    SchedGap(
        "sched.running_batch_filtered_each_iteration",
        ("mode", "requests"),
        "0.5.23 filters finished requests out of the running batch at the top of every "
        "iteration and clears batch_is_full when one left (get_next_batch_to_run, "
        "managers/scheduler.py:3960-3964: 'Every step, not only after a merge'), so a full "
        "batch refills in the iteration after a request finishes; kvspec follows 0.5.11, "
        "which filters only in update_running_batch, after the prefill attempt "
        "(engine/sched/scheduler.py), and refills an iteration later",
        _refilled_early,
        ("0.5.23",),
    ),
    SchedGap(
        "admission.ignore_eos_reserved_in_full",
        ("mode", "requests"),
        "0.5.23's PrefillAdder reserves a running request's remaining tokens at ratio 1.0 "
        "when it ignores EOS (_get_running_request_total_token_offset, managers/"
        "schedule_policy.py:785: 'Fixed-length requests cannot benefit from the early-EOS "
        "estimate'), and so admits less; kvspec follows 0.5.11, reserving new_token_ratio "
        "of them (engine/sched/prefill_adder.py), and the trace's requests ignore EOS",
        _admits_more,
        ("0.5.23",),
    ),
    SchedGap(
        "session.inflight_kept_after_queued_abort",
        ("tokens", "requests"),
        "a streaming turn aborted while it waited never clears its session's in-flight flag "
        "(Session.abort_req, session/session_controller.py:266, is called only from the "
        "streaming cache's release paths, session/streaming_session.py:209/301, which a "
        "request without KV never reaches), so the session refuses its next turn ('Streaming "
        "session already has an active request') and SGLang runs a one-token stand-in for "
        "it; kvspec clears the flag for a request retired without a release "
        "(engine/sched/sessions.py: 0.5.11's gap, closed) and prefills the turn",
        _turn_refused_by_sglang,
        ("0.5.10.post1", "0.5.11"),
    ),
)


def likely_causes(s: Situation) -> tuple[SchedGap, ...]:
    """The known divergences ``s`` looks like (empty: none)."""
    return tuple(k for k in KNOWN if k.available(s) and k.applies is not None and k.applies(s))
