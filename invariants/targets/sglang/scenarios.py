"""Built-in op traces for the sglang target (invariants/scenarios/ops.py format), for the checks
that plain specs do not pin down: a prefix hit then eviction with exact counts (worked out by
hand from SGLang's code: tests/invariants/targets/sglang/test_sglang_target.py), and streaming
sessions with aborts and closes under pressure.

Keeps: each trace is a pure function of its seed (token ids drawn from one generator), so a
finding replays with ``kvspec sglang run --scenario NAME --seed N``.
"""

from __future__ import annotations

import numpy as np

from invariants.scenarios.ops import (
    Abort,
    CloseSession,
    Op,
    OpenSession,
    SessionRef,
    Step,
    Submit,
    Trace,
)
from invariants.scenarios.spec import EngineSpec


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(1, 256, n).tolist()


def sessions_scenario(seed: int = 0, turns: int = 3) -> Trace:
    """Two streaming sessions of ``turns`` turns, non-session traffic sharing their first
    prompts, an aborted running turn, an aborted queued request, close, then pressure."""
    rng = np.random.default_rng(seed)
    engine = EngineSpec(
        page_size=1,
        max_total_tokens=512,
        max_num_reqs=8,
        context_len=512,
        enable_streaming_session=True,
    )
    prompts = {sid: _ids(rng, 24) for sid in ("a", "b")}
    ops: list[Op] = [OpenSession(sid=sid, streaming=True) for sid in prompts]
    for turn in range(turns):
        for sid, prompt in prompts.items():
            ids = prompt if turn == 0 else _ids(rng, 6)
            ops.append(
                Submit(
                    rid=f"{sid}{turn}", input_ids=ids, max_new_tokens=4, session=SessionRef(id=sid)
                )
            )
        ops.append(
            Submit(rid=f"plain{turn}", input_ids=prompts["a"] + _ids(rng, 8), max_new_tokens=3)
        )
        ops.append(Step())
        if turn == 1:
            ops.append(Abort(rid="b1"))  # running turn: released, slot dropped
        ops.append(Step(n=5))
    ops += [Submit(rid="queued", input_ids=_ids(rng, 16), max_new_tokens=2), Abort(rid="queued")]
    ops += [CloseSession(sid=sid) for sid in prompts]
    ops.append(Submit(rid="pressure", input_ids=_ids(rng, 470), max_new_tokens=8))
    return Trace(name="sessions", seed=seed, engine=engine, ops=ops)


def prefix_scenario(page_size: int = 1) -> Trace:
    """A prefix hit, then a request that evicts (pool 64): exact counts a test pins."""
    rng = np.random.default_rng(0)
    engine = EngineSpec(page_size=page_size, max_total_tokens=64, max_num_reqs=8, context_len=128)
    first = _ids(rng, 20)
    ops: list[Op] = [
        Submit(rid="r1", input_ids=first, max_new_tokens=4),
        Step(n=4),
        Submit(rid="r2", input_ids=first[:16] + _ids(rng, 8), max_new_tokens=2),
        Step(n=2),
        Submit(rid="r3", input_ids=_ids(rng, 40), max_new_tokens=2),
    ]
    return Trace(name="prefix", seed=0, engine=engine, ops=ops)


SCENARIOS = {"sessions": sessions_scenario, "prefix": lambda seed=0: prefix_scenario()}
