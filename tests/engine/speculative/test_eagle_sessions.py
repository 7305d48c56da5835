"""EAGLE with streaming sessions (SGLang's EagleV1 / EagleV2 session classes, §4.1): a turn
right after a successful one inherits its KV with SGLang's offsets — v1 (no overlap) -1, v2
(overlap, bonus pre-claimed) 0 — sessions mixed with plain traffic under forced retract and
large pages run clean under the whole catalog, and the #22651 bonus lag shows up both as the
old -1 offset of v2 and as an invariant violation."""

from __future__ import annotations

import numpy as np
import pytest

from engine.engine import Engine
from engine.request import SamplingParams
from engine.speculative import accounting
from invariants.checking.checker import InvariantViolation
from tests.engine.sched.sched_support import strict_hook
from tests.engine.speculative.spec_support import small_config


def _offsets(version: int, page_size: int, checked: bool = True, turns: int = 5) -> list[int]:
    """One streaming session, ``turns`` turns of 10 new tokens and 3..11 output tokens:
    cached_tokens of each turn minus prompt + completion of the one before."""
    config = small_config(version, page_size=page_size, enable_streaming_session=True, seed=3)
    engine = Engine(config, observers=[strict_hook()] if checked else [])
    sid = engine.open_session(4096, streaming=True)
    rng = np.random.default_rng(page_size)
    offsets, prev = [], None
    for _ in range(turns):
        rid = engine.submit(
            rng.integers(0, 256, 10).tolist(),
            SamplingParams(max_new_tokens=int(rng.integers(3, 12))),
            session_params={"id": sid},
        )
        engine.run_until_idle()
        result = engine.pop_result(rid)
        if prev is not None:
            offsets.append(result.cached_tokens - prev.prompt_tokens - prev.completion_tokens)
        prev = result
    engine.close_session(sid)
    engine.run_until_idle()
    return offsets


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("version", [1, 2])
def test_eagle_turn_inherits_the_last_turns_kv(version: int, page_size: int) -> None:
    """kv_inherit_offset: v1 -1 (the last token's KV is never written), v2 0 (the finishing
    round's extra round wrote it and its slot was pre-claimed) — at every turn."""
    assert _offsets(version, page_size) == [-1 if version == 1 else 0] * 4


def test_bonus_lag_costs_v2_one_inherited_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """#22651: without the pre-claimed bonus, a v2 turn whose last round did not overshoot
    inherits one token less (the -1 SGLang's EagleV2 session test saw; an overshooting one
    is trimmed to its target either way, #22897) — and the strict checker stops it at once."""
    monkeypatch.setattr(accounting, "preclaim_bonus", lambda req: None)
    monkeypatch.setattr(
        accounting,
        "resolve_accepted",
        lambda req, n: setattr(req, "kv_committed_len", req.kv_committed_len + n),
    )
    lagging = _offsets(2, 4, checked=False)
    assert -1 in lagging and set(lagging) <= {-1, 0}
    with pytest.raises(InvariantViolation, match=r"spec\.overalloc_bounded"):
        _offsets(2, 4)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("page_size", [4, 256])
def test_eagle_sessions_with_plain_traffic_and_retract_are_clean(
    version: int, page_size: int
) -> None:
    """Three streaming sessions and plain requests, forced retract every third forward
    (SGLang's ...EagleRetractLargePage): no invariant fires at any event, and every turn
    returns its tokens."""
    config = small_config(
        version,
        page_size=page_size,
        total=64 * max(page_size, 16),
        retract=True,
        enable_streaming_session=True,
        seed=7,
    )
    engine = Engine(config, observers=[strict_hook()])
    sids = [engine.open_session(8192, streaming=True) for _ in range(3)]
    rng = np.random.default_rng(version)
    for _ in range(4):
        rids = [
            engine.submit(
                rng.integers(0, 256, int(rng.integers(4, 40))).tolist(),
                SamplingParams(max_new_tokens=int(rng.integers(2, 20))),
                session_params={"id": sid},
            )
            for sid in sids
        ]
        rids += [
            engine.submit(rng.integers(0, 256, 30).tolist(), SamplingParams(max_new_tokens=15))
        ]
        engine.run_until_idle()
        assert all(engine.pop_result(rid).completion_tokens > 0 for rid in rids)
    for sid in sids:
        engine.close_session(sid)
    engine.run_until_idle()
    assert engine.stats.retracted_reqs > 0 and sum(engine.stats.spec_accept_hist) > 0
