"""Planted faults in vLLM's block pool (what `make test-vllm` proves the catalog catches): from
step ``step`` on, once — ``skip_free`` a freed block never returns to the free queue (a leak),
``double_free`` a freed block is appended twice, ``unpinned_hit`` a prefix-cache hit is not
touched (its ref_cnt stays 0: it sits in the free queue while a request holds it),
``early_window_free`` a sliding-window or chunked-local group frees two blocks more than its
window or chunk allows (the forward in flight or the next still reads them; one block could
stay clear of every read: vLLM frees on the processed-token basis, a step behind under async
scheduling); and, from ``step`` on at every allocation, ``spec_unreserved`` reserves no slots
for a request's draft tokens — neither the scheduled drafts' nor EAGLE's lookahead — so a
verify computes tokens its table has no block for (``fired`` names the requests);
``early_deferred_free`` frees a finished or preempted request's blocks at once though a
consumer connector fences them behind the step in flight (vLLM's ``deferred_frees``);
``spec_rehome`` moves a request's tail block to a fresh one after a verify rejected drafts,
freeing the old one while the step in flight (async scheduling) still writes it;
``mamba_state_freed`` returns a Mamba group's current state block to the pool while the
request's table still lists it."""

from __future__ import annotations

from in_flight import local_span
from stack import frees_now
from vllm.v1.core.block_pool import BlockPool


class Fault:
    def __init__(self, kind: str, step: int, pool: BlockPool) -> None:
        self.kind, self.step, self.pool, self.armed, self.fired = kind, step, pool, False, []
        self.now = 0

    def at_step(self, step: int) -> None:
        self.now = step
        self.armed = step >= self.step and not self.fired


def install(spec: dict | None, sched) -> Fault | None:
    pool = sched.kv_cache_manager.coordinator.block_pool
    if not spec:
        return None
    fault = Fault(spec["kind"], spec["step"], pool)
    if fault.kind == "early_window_free":
        _early_window_free(sched.kv_cache_manager.coordinator, fault)
        return fault
    if fault.kind == "spec_unreserved":
        _spec_unreserved(sched.kv_cache_manager, fault)
        return fault
    if fault.kind in SCHEDULER_FAULTS:
        SCHEDULER_FAULTS[fault.kind](sched, fault)
        return fault
    patch = {"skip_free": _skip_free, "double_free": _double_free, "unpinned_hit": _unpinned}
    patch[fault.kind](pool, fault)
    return fault


def _spec_unreserved(manager, fault: Fault) -> None:
    real = manager.allocate_slots

    def allocate_slots(request, num_new_tokens, *args, **kwargs):
        drafts = len(request.spec_token_ids or ())
        if fault.step <= fault.now and 0 < drafts < num_new_tokens:
            if request.request_id not in fault.fired:
                fault.fired.append(request.request_id)
            num_new_tokens -= drafts  # fix: the drafts' slots too
            kwargs["num_lookahead_tokens"] = 0  # fix: and the lookahead the proposer writes
        return real(request, num_new_tokens, *args, **kwargs)

    manager.allocate_slots = allocate_slots


def _early_window_free(coordinator, fault: Fault) -> None:
    for manager in coordinator.single_type_managers:
        if any(local_span(manager)):
            _skip_two_blocks_more(manager, fault)


def _skip_two_blocks_more(manager, fault: Fault) -> None:
    real, size = manager.get_num_skipped_tokens, manager.block_size

    def get_num_skipped_tokens(num_computed_tokens: int) -> int:
        skipped = real(num_computed_tokens)
        if fault.armed and skipped > 0:
            fault.armed = False
            fault.fired.append(skipped // size + 1)  # the second block freed too early
            return skipped + 2 * size
        return skipped

    manager.get_num_skipped_tokens = get_num_skipped_tokens


def _skip_free(pool, fault: Fault) -> None:
    real = pool.free_blocks

    def free_blocks(blocks):
        blocks = list(blocks)
        if fault.armed and blocks:
            fault.fired.append(blocks[0].block_id)
            fault.armed = False
            blocks[0].ref_cnt -= 1  # the count drops, the block never reaches the queue
            blocks = blocks[1:]
        real(blocks)

    pool.free_blocks = free_blocks


def _double_free(pool, fault: Fault) -> None:
    real = pool.free_blocks

    def free_blocks(blocks):
        blocks = list(blocks)
        real(blocks)
        if fault.armed and blocks and blocks[0].ref_cnt == 0:
            fault.fired.append(blocks[0].block_id)
            fault.armed = False
            pool.free_block_queue.append(blocks[0])  # a second time

    pool.free_blocks = free_blocks


def _unpinned(pool, fault: Fault) -> None:
    real = pool.touch

    def touch(blocks):
        hit = [b for b in blocks if not b.is_null and b.ref_cnt == 0]
        if fault.armed and hit:
            fault.fired.append(hit[0].block_id)
            fault.armed = False
            return real([b for b in blocks if b is not hit[0]])  # it stays free, unpinned
        return real(blocks)

    pool.touch = touch


def _early_deferred_free(sched, fault: Fault) -> None:
    real = sched._free_request_blocks

    def free_request_blocks(request) -> None:
        if not fault.armed or frees_now(sched, request):
            return real(request)
        fault.armed = False
        ids = sched.kv_cache_manager.get_block_ids(request.request_id)
        fault.fired.extend(b for group in ids for b in group)
        sched.kv_cache_manager.free(request)  # fix: defer them behind the step in flight

    sched._free_request_blocks = free_request_blocks


def _spec_rehome(sched, fault: Fault) -> None:
    real = sched.update_from_output

    def update_from_output(out, model_out):
        drafts = out.scheduled_spec_decode_tokens
        rejected = [
            rid
            for rid, tokens in zip(model_out.req_ids, model_out.sampled_token_ids)
            if drafts.get(rid) and len(tokens) <= len(drafts[rid])
        ]
        result = real(out, model_out)
        for rid in rejected if fault.armed else ():
            _rehome_tail(sched, rid, fault)
        return result

    sched.update_from_output = update_from_output


def _rehome_tail(sched, rid: str, fault: Fault) -> None:
    """Put a fresh block where ``rid``'s last computed token lies; free the old one."""
    request, pool = sched.requests.get(rid), sched.kv_cache_manager.block_pool
    if request is None or request.is_finished() or pool.get_num_free_blocks() < 1:
        return
    manager = sched.kv_cache_manager.coordinator.single_type_managers[0]
    table = manager.req_to_blocks.get(rid, [])
    i = (request.num_computed_tokens - 1) // manager.block_size
    if not 0 <= i < len(table) or table[i].is_null or table[i].ref_cnt != 1:
        return
    old, table[i] = table[i], pool.get_new_blocks(1)[0]
    if old.block_hash is not None:
        return  # (a cached block: not this fault's)
    pool.free_blocks([old])  # fix: the step in flight writes it; keep it
    fault.armed = False
    fault.fired.append(old.block_id)


def _mamba_state_freed(sched, fault: Fault) -> None:
    for manager in sched.kv_cache_manager.coordinator.single_type_managers:
        if type(manager).__name__ == "MambaManager":
            _free_state_block(manager, fault)


def _free_state_block(manager, fault: Fault) -> None:
    real = manager.remove_skipped_blocks

    def remove_skipped_blocks(request_id, processed_computed_tokens, *args, **kwargs):
        real(request_id, processed_computed_tokens, *args, **kwargs)
        table = manager.req_to_blocks.get(request_id, [])
        i = (processed_computed_tokens - 1) // manager.block_size
        if fault.armed and 0 <= i < len(table) and table[i].ref_cnt == 1:
            fault.armed = False
            fault.fired.append(table[i].block_id)
            manager.block_pool.free_blocks([table[i]])  # fix: null it in the table first

    manager.remove_skipped_blocks = remove_skipped_blocks


SCHEDULER_FAULTS = {
    "early_deferred_free": _early_deferred_free,
    "spec_rehome": _spec_rehome,
    "mamba_state_freed": _mamba_state_freed,
}
