"""PrefillAdder: the token budget, page-aligned chunk truncation, the single-chunk rule."""

from __future__ import annotations

import pytest

from engine.config import MemoryConfig
from engine.memory import KVMemory
from engine.request import Req, SamplingParams
from engine.sched.prefill_adder import AddReqResult, PrefillAdder


def _mem(page_size: int = 1, total: int = 1024, cache: str = "radix") -> KVMemory:
    return KVMemory.from_config(
        MemoryConfig(
            page_size=page_size,
            max_total_tokens=total,
            max_num_reqs=8,
            context_len=1024,
            cache=cache,
        )
    )


def _req(rid: str, n: int, max_new: int = 16, start: int = 0) -> Req:
    return Req(
        rid, list(range(start, start + n)), sampling_params=SamplingParams(max_new_tokens=max_new)
    )


def _offer(adder: PrefillAdder, mem: KVMemory, req: Req, has_chunked: bool = False) -> AddReqResult:
    req.init_next_round_input(mem)
    return adder.add_one_req(req, has_chunked_req=has_chunked)


def test_budget_is_free_plus_evictable_minus_running_headroom() -> None:
    """rem_total = free + evictable − Σ_running min(max_new − len(out), clip) × new_token_ratio,
    then each admitted request charges ceil(extend) + max_new + one page."""
    mem = _mem()
    running = _req("run", 8, max_new=100)
    running.output_ids = [1] * 20
    adder = PrefillAdder(
        mem, [running], new_token_ratio=0.5, rem_input_tokens=4096, rem_chunk_tokens=None
    )
    assert adder.rem_total_tokens == 1024 - 80 * 0.5
    assert _offer(adder, mem, _req("a", 10, max_new=16)) is AddReqResult.CONTINUE
    assert adder.rem_total_tokens == 1024 - 40 - (10 + 16 + 1)
    assert adder.cur_rem_tokens == 1024 - (10 + 1)


def test_request_that_does_not_fit_is_refused_with_no_token() -> None:
    """A request whose prompt, decode budget and page slack reach the remaining budget is
    refused (NO_TOKEN) and takes no lock."""
    mem = _mem(total=128)
    adder = PrefillAdder(mem, [], 0.7, 4096, None)
    req = _req("big", 100, max_new=28)  # 100 + 28 + 1 >= 128
    assert _offer(adder, mem, req) is AddReqResult.NO_TOKEN
    assert not adder.can_run_list and mem.tree_cache.protected_size() == 0


def test_prefill_token_budget_closes_the_batch() -> None:
    """``max_prefill_tokens`` (rem_input_tokens): the first request always fits, a later one
    that reaches the budget ends the batch (OTHER)."""
    mem = _mem()
    adder = PrefillAdder(mem, [], 0.7, rem_input_tokens=64, rem_chunk_tokens=None)
    assert _offer(adder, mem, _req("a", 40, start=0)) is AddReqResult.CONTINUE
    assert _offer(adder, mem, _req("b", 30, start=500)) is AddReqResult.OTHER
    assert [r.rid for r in adder.can_run_list] == ["a"]


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_truncated_chunk_is_page_aligned(page_size: int) -> None:
    """A prompt longer than the chunk budget takes ``rem_chunk_tokens // ps * ps`` tokens, is
    the batch's new chunked request, and holds its prefix lock."""
    mem = _mem(page_size=page_size)
    adder = PrefillAdder(mem, [], 0.7, 4096, rem_chunk_tokens=100)
    req = _req("long", 300)
    assert _offer(adder, mem, req) in (AddReqResult.CONTINUE, AddReqResult.OTHER)
    trunc = 100 // page_size * page_size
    assert (
        adder.new_chunked_req is req
        and req.extend_input_len == trunc
        and len(req.fill_ids) == trunc
    )


def test_second_chunked_request_is_refused_while_one_is_in_flight() -> None:
    """Regression (single chunked request rule, INV-CHUNKED-SINGLE): while a chunked prefill
    continues, or once this batch started one, a request that would need truncation is not
    started (OTHER) even where chunk budget remains; a request that fits whole still is."""
    mem = _mem(page_size=4)
    adder = PrefillAdder(mem, [], 0.7, 4096, rem_chunk_tokens=200)
    assert _offer(adder, mem, _req("b", 300, start=1000), has_chunked=True) is AddReqResult.OTHER
    assert adder.new_chunked_req is None and not adder.can_run_list
    assert _offer(adder, mem, _req("c", 150, start=2000), has_chunked=True) is AddReqResult.CONTINUE
    first = _req("d", 300, start=3000)
    _offer(adder, mem, first)
    assert adder.new_chunked_req is first and first.extend_input_len == 48
    adder.rem_chunk_tokens = 200  # budget left over (e.g. a memory-capped continuing chunk)
    second = _req("e", 300, start=4000)
    assert _offer(adder, mem, second) is AddReqResult.OTHER
    assert adder.new_chunked_req is first and second not in adder.can_run_list


def test_continuing_chunk_is_always_added_even_without_budget() -> None:
    """Regression ("must be added … otherwise memory leak"): the in-flight chunked request
    joins every prefill batch; with no memory budget left it still takes a full chunk."""
    mem = _mem(total=256)
    running = _req("run", 8, max_new=4000)
    adder = PrefillAdder(mem, [running], 1.0, 4096, rem_chunk_tokens=64)
    assert adder.rem_total_tokens <= 0
    chunked = _req("chunked", 200)
    chunked.init_next_round_input(mem)
    assert adder.add_chunked_req(chunked) is chunked
    assert adder.can_run_list == [chunked] and chunked.extend_input_len == 64


def test_last_chunk_reserves_the_decode_budget() -> None:
    """The final chunk is not truncated: it is returned as done (None) and charges max_new."""
    mem = _mem()
    adder = PrefillAdder(mem, [], 0.7, 4096, rem_chunk_tokens=64)
    req = _req("tail", 40, max_new=30)
    req.init_next_round_input(mem)
    before = adder.rem_total_token_offset
    assert adder.add_chunked_req(req) is None
    assert adder.rem_total_token_offset - before == 40 + 30 + 1
