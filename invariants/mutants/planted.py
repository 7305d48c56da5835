"""Planted bugs: the zoo entries whose precondition no op trace reaches in kvspec's engine.
For each, the zoo builds the state by hand — the fixed engine's, then the bug's — and runs
the shipped catalog on the resulting views (the regression tests take the same builders).

Keeps: ``plant(False)`` is what the fixed code leaves (it must be clean, or the catch would
mean nothing); ``plant(True)`` runs the mutant's own body from session.py / speculative.py
where one exists, and plants only what kvspec's design never lets happen; every entry says
why no trace reaches it.
"""

from __future__ import annotations

from engine.cache.streaming_session import StreamingSession
from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.mem.allocator import SWAAllocator
from engine.memory import KVMemory
from engine.model.tokenizer import ByteTokenizer
from engine.observe.memory_view import memory_view
from engine.request import FinishReason, Req, SamplingParams
from engine.sched.sessions import SessionParams
from engine.speculative import accounting
from invariants.mutants.base import Planted, PlantedViews, ids
from invariants.mutants.session import pre_abort_restores
from invariants.mutants.speculative import trim_leaving_swa_cursor

# ---- #22900: the overshoot trim and the SWA cursor ----

OVERSHOOT_MEMORY = MemoryConfig(
    page_size=4,
    max_total_tokens=256,
    max_num_reqs=2,
    context_len=64,
    swa_tokens=256,
    sliding_window=8,
)


def overshoot_req(mem: KVMemory) -> Req:
    """A finishing v2 request (page size 4, window 8): prompt 36, 6 output tokens of which
    2 are returned (target 38), committed 42, reserved to 48, SWA KV freed up to 40 (the
    #22900 report: cursor 42 > target 38)."""
    req = Req(
        "r", [(5 * i) % 256 for i in range(36)], sampling_params=SamplingParams(max_new_tokens=2)
    )
    req.init_next_round_input(mem)
    mem.alloc_for_extend([req])
    accounting.extend_allocation(mem, [req], [48])
    req.output_ids = [1, 2, 3, 4, 5, 6]
    req.kv_committed_len = 42
    accounting.check_finished_each(req, 0)
    assert isinstance(mem.allocator, SWAAllocator) and req.req_pool_idx is not None
    mem.allocator.free_swa(mem.req_to_token_pool.read(req.req_pool_idx, 0, 40))
    req.swa_evicted_seqlen = 40
    return req


def swa_overshoot(bug: bool) -> PlantedViews:
    """The #22900 request trimmed by the fixed ``trim_overshoot`` or by the pre-#22900 body,
    seen between the trim and the release (so not ``req.finished_released``'s business)."""
    mem = KVMemory.from_config(OVERSHOOT_MEMORY)
    req = overshoot_req(mem)
    (trim_leaving_swa_cursor if bug else accounting.trim_overshoot)(mem, req)
    return [("step", memory_view(mem, "step", 1, [req]))]


# ---- #22790: a pre-aborted turn continues the slot ----

PREABORT_CONFIG = EngineConfig(
    memory=MemoryConfig(page_size=4, max_total_tokens=2048, max_num_reqs=16, context_len=512),
    chunked_prefill_size=64,
    enable_overlap=False,
    enable_streaming_session=True,
)
FIRST_TURN = ByteTokenizer().encode("Let me tell you something about France.", add_bos=True)


def preabort_slot(bug: bool) -> PlantedViews:
    """Turn 1 runs on a real engine (slot: committed 47, protected 40); then SGLang's
    tokenizer pre-aborts turn 2 (input too long: ``to_finish`` set, prompt replaced by
    ``[0]``) and queues it. The fixed ``find_active_slot`` detaches it (the slot stays);
    the pre-#22790 one hands it the slot, which SGLang 0.5.10 then saved with the turn's
    one-token prefix (committed = allocated = 1 under the protected 40: held = -39)."""
    engine = Engine(PREABORT_CONFIG)
    sid = engine.open_session(1000, streaming=True)
    rid = engine.submit(FIRST_TURN, SamplingParams(max_new_tokens=8), session_params={"id": sid})
    engine.run_until_idle()
    engine.pop_result(rid)
    cache = engine.mem.streaming
    assert isinstance(cache, StreamingSession)
    req = engine.sessions.create_req(
        "turn-2",
        [0],
        SessionParams(id=sid),
        lambda ids: Req("turn-2", ids, sampling_params=SamplingParams(max_new_tokens=8)),
        engine.scheduler.abort,
    )
    req.origin_input_ids = [0]  # SGLang's stand-in for the too-long prompt
    req.to_finish = FinishReason.of_abort("Input length exceeds the maximum allowed length", 400)
    slot = (pre_abort_restores if bug else StreamingSession.find_active_slot)(cache, req)
    if slot is not None:  # what 0.5.10 did with it: restore, one-token prefill, save
        slot.kv_committed_len = slot.kv_allocated_len = len(req.origin_input_ids)
        engine.sessions.sessions[sid].abort_req(req)
    engine.sessions.on_retired(req)
    return [("session", engine.state_view("session")), ("idle", engine.state_view("idle"))]


PLANTED: tuple[Planted, ...] = (
    Planted(
        "22790-pre-abort-restores-slot",
        "sglang#22790",
        "a pre-aborted (too long) turn still restores the slot and saves its one-token prefix "
        "into it",
        preabort_slot,
        ids("session.held_nonneg"),
        why="kvspec answers a too-long input at submit (status 400, never queued; SGLang queued it "
        "as [0] with to_finish set), and the only other to_finish turn that reaches a match is "
        "one aborted then retracted, whose retract already wiped the slot",
    ),
    Planted(
        "22900-swa-cursor-uncapped",
        "sglang#22900",
        "the overshoot trim leaves swa_evicted_seqlen above the trimmed committed length",
        swa_overshoot,
        ids("req.swa_evicted_le_committed"),
        catalog_off=ids("req.finished_released"),
        why="kvspec's SWA cursor is set at prepare to at most committed - window - page, and a "
        "finishing v2 round's target (origin + finished_len) is above the committed length "
        "that prepare saw, so the cursor never passes it",
    ),
)

__all__ = ["OVERSHOOT_MEMORY", "PLANTED", "overshoot_req", "preabort_slot", "swa_overshoot"]
