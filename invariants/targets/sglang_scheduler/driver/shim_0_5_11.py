"""How SGLang 0.5.11's real Scheduler is built and read on a CPU-only box: the shims of this
release beyond those it shares with 0.5.10.post1 (shim_common_0_5_1x.py, re-exported here),
each with the reason it exists. 0.5.11 is the first release with the fixes of #22213 and
#22862 (``StreamingSession._free_tail``).

Keeps: one module per SGLang release (``shim_<version>.py``); what changed between releases
lives in it and nowhere else. Runs inside the sglang venv; imports nothing of kvspec.

Shims (why):
5. The streaming sessions moved to ``sglang.srt.session`` (``StreamingSession``, embedded in
   the radix cache or wrapping another cache): a slot still copies a turn's KV fields at
   finish and back at the next match (read as 0.5.10.post1's are), and the session now keeps
   an in-flight flag and a close that waits for the turn (``_inflight``, ``close_on_finish``).
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

VERSION = "0.5.11"
NOT_APPLICABLE: dict[str, str] = {}  # row 0 is reserved again (free_slots from 1)


def session_state(session, live: list) -> tuple[bool, bool]:
    """(a streaming turn is in flight, the close waits for it): the session's own flags."""
    return bool(session._inflight), bool(session.close_on_finish)
