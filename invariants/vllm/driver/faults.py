"""Planted faults in vLLM's block pool (what `make test-vllm` proves the catalog catches): from
step ``step`` on, once — ``skip_free`` a freed block never returns to the free queue (a leak),
``double_free`` a freed block is appended twice, ``unpinned_hit`` a prefix-cache hit is not
touched (its ref_cnt stays 0: it sits in the free queue while a request holds it),
``early_window_free`` a sliding-window group frees one block more than its window allows (the
block the next forward still reads becomes the null block)."""

from __future__ import annotations

from vllm.v1.core.block_pool import BlockPool


class Fault:
    def __init__(self, kind: str, step: int, pool: BlockPool) -> None:
        self.kind, self.step, self.pool, self.armed, self.fired = kind, step, pool, False, []

    def at_step(self, step: int) -> None:
        self.armed = step >= self.step and not self.fired


def install(spec: dict | None, sched) -> Fault | None:
    pool = sched.kv_cache_manager.coordinator.block_pool
    if not spec:
        return None
    fault = Fault(spec["kind"], spec["step"], pool)
    if fault.kind == "early_window_free":
        _early_window_free(sched.kv_cache_manager.coordinator, fault)
        return fault
    patch = {"skip_free": _skip_free, "double_free": _double_free, "unpinned_hit": _unpinned}
    patch[fault.kind](pool, fault)
    return fault


def _early_window_free(coordinator, fault: Fault) -> None:
    for manager in coordinator.single_type_managers:
        if getattr(manager, "sliding_window", None):
            _skip_one_block_more(manager, fault)


def _skip_one_block_more(manager, fault: Fault) -> None:
    real, size = manager.get_num_skipped_tokens, manager.block_size

    def get_num_skipped_tokens(num_computed_tokens: int) -> int:
        skipped = real(num_computed_tokens)
        if fault.armed and skipped > 0:
            fault.armed = False
            fault.fired.append(skipped // size)  # the index of the block freed too early
            return skipped + size
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
