"""EAGLE's KV accounting, step by step (one request, page size 4, num_draft_tokens 4):
v1 reserves the verify window at prepare and trims to ``committed += accepted + 1`` with a
page-aligned free; v2 reserves ``x = committed + 2 * alloc_len - allocated``, pre-claims the
bonus slot and resolves ``accept_len - 1``; a finishing v2 request is trimmed back to its
returned tokens (output, KV and SWA cursor); the configuration enforces SGLang's pairings."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
import pytest

from engine.config import EngineConfig, MemoryConfig
from engine.config.speculative import SpecConfig
from engine.engine import Engine
from engine.errors import ConfigError
from engine.memory import KVMemory
from engine.request import Req, SamplingParams
from engine.speculative import accounting
from tests.engine.sched.sched_support import strict_hook
from tests.engine.speculative.spec_support import small_config

PROMPT = [(7 * i + 3) % 256 for i in range(10)]


@dataclass
class Trace:
    """Observer: the one request's (event, committed, allocated, output, device seq_len,
    accept_len) at every event where it holds a row, and the free full-pool tokens."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def on_event(self, event: str, engine: Any) -> None:
        if event not in ("schedule", "process"):
            return
        view = engine.state_view(event)
        for r in view.reqs:
            if r.req_pool_idx >= 0:
                self.rows.append(
                    (
                        event,
                        r.kv_committed_len,
                        r.kv_allocated_len,
                        r.num_output,
                        r.spec_seq_len,
                        r.spec_accept_len,
                        view.pools[0].free,
                    )
                )


def _trace(version: int, max_new: int = 24) -> tuple[Trace, Engine]:
    trace = Trace()
    engine = Engine(small_config(version, accept_prob=0.6), observers=[strict_hook(), trace])
    engine.generate([PROMPT], SamplingParams(max_new_tokens=max_new))
    return trace, engine


def test_v1_reserves_the_verify_window_and_trims_to_accepted_plus_bonus() -> None:
    """v1: prepare holds [committed, committed + 4); after the verify, committed grew by the
    tokens appended (accepted drafts + the bonus) and allocated equals it; the rejected tail
    went back page-aligned (free tokens = capacity - ceil(committed) - tree-held)."""
    trace, _ = _trace(1)
    decode = [
        (a, b) for a, b in zip(trace.rows, trace.rows[1:]) if a[0] == "schedule" and a[2] > a[1]
    ]
    assert decode
    for (_, c, alloc, out, _, _, _), (ev, c2, alloc2, out2, seq2, acc2, _) in decode:
        assert ev == "process" and alloc == c + 4  # the verify window
        assert alloc2 == c2 and c2 - c == out2 - out  # committed += appended, trimmed
        assert out2 == out + acc2 or c2 == len(PROMPT) + 24 - 1  # unless it finished mid-round
        assert seq2 >= c2


def test_v2_reserves_two_windows_and_preclaims_the_bonus() -> None:
    """v2: after prepare, allocated = committed_before + 2 * alloc_len and committed =
    committed_before + 1 (the bonus slot); a resolve adds accept_len - 1; the device runs
    at most one round ahead of the CPU."""
    trace, engine = _trace(2)
    sched = [r for r in trace.rows if r[0] == "schedule"]
    for before, after in pairwise(sched):
        _, c, alloc, *_ = after
        assert alloc - c == 2 * 4 - 1 or (alloc - c < 2 * 4 - 1 and alloc == before[2])  # x >= 0
    processes = [r for r in trace.rows if r[0] == "process"]
    assert any(p[1] == p[4] - p[5] + 1 for p in processes)
    assert all(p[4] - p[1] <= 4 for p in processes)
    assert sum(engine.stats.spec_accept_hist) > 3


def test_v2_finish_trims_output_kv_and_cursor_to_the_returned_tokens() -> None:
    """A v2 request whose last round accepts past max_new_tokens releases exactly origin +
    finished_len committed and allocated slots, and returns finished_len tokens."""
    mem = KVMemory.from_config(
        MemoryConfig(page_size=4, max_total_tokens=256, max_num_reqs=2, context_len=64)
    )
    req = Req("r", list(range(10)), sampling_params=SamplingParams(max_new_tokens=3))
    req.init_next_round_input(mem)
    mem.alloc_for_extend([req])
    accounting.extend_allocation(mem, [req], [10 + 8])
    req.kv_committed_len = 15  # resolved past the finish: 5 tokens, 2 of them overshoot
    req.output_ids = [1, 2, 3, 4, 5]
    accounting.check_finished_each(req, 0)
    assert req.finished_len == 3 and req.output_ids == [1, 2, 3, 4, 5]
    free_before = mem.allocator.available_size()
    accounting.trim_overshoot(mem, req)
    assert (req.kv_committed_len, req.kv_allocated_len, req.output_ids) == (13, 13, [1, 2, 3])
    assert mem.allocator.available_size() - free_before == 4  # page [16, 20); [13, 16) stays


def test_check_finished_each_stops_at_the_first_stop_token() -> None:
    """The finish condition is checked after each new token in turn: a stop token in the
    middle of an accepted run sets finished_len there; the later tokens are overshoot."""
    req = Req(
        "r", [1], sampling_params=SamplingParams(max_new_tokens=50), eos_token_ids=frozenset({9})
    )
    req.output_ids = [4, 5, 9, 6, 7]
    accounting.check_finished_each(req, 1)
    assert req.finished_reason is not None and req.finished_reason.kind == "stop"
    assert req.finished_len == 3 and len(req.output_ids) == 5


def test_config_pairs_the_version_with_the_overlap_scheduler() -> None:
    """v2 needs overlap on, v1 needs it off (SGLang); a top-1 chain verifies num_steps + 1
    tokens; the acceptance probability lies in (0, 1]."""
    with pytest.raises(ConfigError, match="enable_overlap"):
        EngineConfig(enable_overlap=False, speculative=SpecConfig(version=2))
    with pytest.raises(ConfigError, match="enable_overlap"):
        EngineConfig(enable_overlap=True, speculative=SpecConfig(version=1))
    with pytest.raises(ConfigError, match="num_draft_tokens"):
        SpecConfig(num_steps=3, num_draft_tokens=8)
    with pytest.raises(ConfigError, match="accept_prob"):
        SpecConfig(accept_prob=0.0)
    spec = SpecConfig(num_steps=5, num_draft_tokens=6, version=1)
    assert (spec.alloc_len, spec.max_overalloc, SpecConfig().max_overalloc) == (6, 6, 7)


def test_rows_are_widened_for_the_reservation() -> None:
    """A request near the context limit still has room in its row for two verify windows."""
    engine = Engine(small_config(2, num_steps=7))
    assert engine.mem.req_to_token_pool.req_to_token.shape[1] >= 512 + 8 + 2 * 8
    ps = [(np.arange(400) % 256).tolist()]
    assert engine.generate(ps, SamplingParams(max_new_tokens=200))[0].completion_tokens > 0


@pytest.mark.parametrize("version", [1, 2])
def test_aborted_eagle_requests_release_cleanly(version: int) -> None:
    """Requests aborted mid-decode (a pending abort is promoted at the first token of the
    next round, the rest of the round dropped or trimmed) release without a violation, at
    page sizes 1 and 256 under forced retract and stop tokens."""
    from tests.engine.speculative.spec_support import prompts

    for page_size in (1, 256):
        config = small_config(
            version, page_size=page_size, total=64 * max(page_size, 16), retract=True, eos_prob=0.02
        )
        engine = Engine(config, observers=[strict_hook()])
        rids = [
            engine.submit(p, SamplingParams(max_new_tokens=30)) for p in prompts(2, 10, 20, 5, 60)
        ]
        for _ in range(5):
            engine.step()
        for rid in rids[::3]:
            engine.abort(rid)
        engine.run_until_idle()
        kinds = [engine.pop_result(rid).finish_reason.kind for rid in rids]
        assert kinds.count("abort") == 4 and engine.is_idle()
