"""The shims every supported SGLang release shares, each given that release's own classes: the
KV pools as a model runner builds them, the simulated clock, the recording wrappers (refused
session requests, retractions), and the trace's control ops as that release's inputs.

Keeps: nothing here names a module path or a constructor that moved between releases; the
release's shim (``shim_<version>.py``) imports its classes and passes them in. Runs inside the
sglang venv; imports nothing of kvspec.
"""

from __future__ import annotations

import time as _time

import torch
from reader import END


def kv_pools(
    cfg: dict, kv_cls, token_allocator, paged_allocator, rows_cls, row_extra: int = 8
) -> dict:
    """SGLang's own KV pool, allocator and request rows for one tiny layer, as its model
    runner builds them (the classes are the release's); a row holds ``max_context +
    row_extra`` positions (the release's own headroom where it sizes one)."""
    page, tokens = cfg["page_size"], cfg["pool_tokens"]
    kv = kv_cls(
        size=tokens,
        page_size=page,
        dtype=torch.float16,
        head_num=1,
        head_dim=4,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    extra = {"page_size": page} if page > 1 else {}
    allocator = (paged_allocator if page > 1 else token_allocator)(
        size=tokens, dtype=torch.float16, device="cpu", kvcache=kv, need_sort=False, **extra
    )
    rows = rows_cls(
        size=cfg["max_reqs"],
        max_context_len=cfg["max_context"] + row_extra,
        device="cpu",
        enable_memory_saver=False,
    )
    return dict(token_to_kv_pool=kv, token_to_kv_pool_allocator=allocator, req_to_token_pool=rows)


class ClockedTime:
    """The ``time`` module with ``monotonic`` read from the driver's clock."""

    def __init__(self, now) -> None:
        self.monotonic = now

    def __getattr__(self, name: str):
        return getattr(_time, name)


def set_clock(modules: list, now) -> None:
    """Session timeouts and the once-a-second session reap read ``time.monotonic()`` in
    ``modules``; ``now`` (the driver's simulated clock) answers instead, so runs replay."""
    for module in modules:
        module.time = ClockedTime(now)


def record_refusals(session_cls, refused: set) -> None:
    """The rids ``Session.create_req`` refuses (it returns them already aborted) go to
    ``refused``; a request refused later (prompt too long) was accepted by its session."""
    real = session_cls.create_req

    def recording(self, req, *args, **kwargs):
        new_req = real(self, req, *args, **kwargs)
        if new_req.to_finish is not None:
            refused.add(new_req.rid.removesuffix(END))
        return new_req

    session_cls.create_req = recording


class RetractCounter:
    """Wraps ``ScheduleBatch.retract_decode`` to count the requests it retracts."""

    def __init__(self, batch_cls) -> None:
        self.count, real = 0, batch_cls.retract_decode

        def counting(batch, *args, **kwargs):
            result = real(batch, *args, **kwargs)
            self.count += len(result[0])
            return result

        batch_cls.retract_decode = counting


def sampling_params(op: dict, params_cls):
    """Greedy sampling of ``max_new_tokens`` (the fake worker picks the tokens anyway)."""
    params = params_cls(
        max_new_tokens=op["max_new_tokens"], temperature=0.0, ignore_eos=op["ignore_eos"]
    )
    params.normalize(None)
    params.verify(512)
    return params


def session_input(op: dict, io_struct):
    if op["op"] == "close_session":
        return io_struct.CloseSessionReqInput(session_id=op["session_id"])
    return io_struct.OpenSessionReqInput(
        capacity_of_str_len=100_000,
        session_id=op["session_id"],
        streaming=op.get("streaming", False),
        timeout=op.get("timeout"),
    )
