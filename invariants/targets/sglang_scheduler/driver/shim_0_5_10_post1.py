"""How SGLang 0.5.10.post1's real Scheduler is built and read on a CPU-only box: the shims
of this release beyond those it shares with 0.5.11 (shim_common_0_5_1x.py, re-exported here:
the fake worker, the allocator kernels, the global server args, the checks called not
asserted), each with the reason it exists. 0.5.10.post1 is the last release before the fixes
of #22213 (the busy check's double count) and #22862 (the retract tail leak).

Keeps: one module per SGLang release (``shim_<version>.py``); what changed between releases
lives in it and nowhere else. Runs inside the sglang venv; imports nothing of kvspec.

Shims (why):
5. The streaming-session state is the release's own (``SessionAwareCache``): a slot copies a
   turn's KV fields at finish (``SessionSlot.save_from_req``) and back at the next turn's
   match (``restore_to_req``); while a turn runs, it shares the slot's row — the census reads
   that row once, with the running turn's lengths. There is no in-flight flag: a turn is in
   flight while the session's last request is unfinished, and a close never waits.
"""

from __future__ import annotations

from shim_common_0_5_1x import (  # noqa: F401 - the driver reads them off this module
    abort_input,
    build,
    busy_check,
    counters,
    fill_len,
    flush_input,
    free_pages,
    generate_input,
    record_checks,
    record_refusals,
    req_kv,
    retracted,
    session_input,
    session_slots,
    sessions,
    set_clock,
    set_output,
    set_receiver,
    swa_evicted,
    tree_nodes,
)

VERSION = "0.5.10.post1"
# catalog ids that do not hold by this release's design (not bugs): id -> why
NOT_APPLICABLE = {
    "req_pool.row_zero_reserved": "this release's ReqToTokenPool hands out row 0 "
    "(free_slots = range(size)); 0.5.23 reserves it",
}


def session_state(session, live: list) -> tuple[bool, bool]:
    """(a streaming turn is in flight, the close waits for it). No flag in this release: a turn
    is in flight while the session's last request is still held by the scheduler (``live``:
    the session's unfinished requests there; a turn aborted from the waiting queue never
    finishes, yet this release takes the next turn). A close never waits."""
    last = [node.req for node in session.req_nodes.values()]
    return session.streaming and any(req in live for req in last), False
