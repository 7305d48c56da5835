"""The wrappers every adapter puts around SGLang's own functions, given the release's own
classes: the simulated clock, the recording of refused session requests and of retractions.

Keeps: a wrapper calls SGLang's function and only records what it returned; nothing here
names a module path or a class that moved between releases (the adapter passes them in).
Runs inside the sglang venv; imports nothing of kvspec.
"""

from __future__ import annotations

import time as _time

from reader import END


class ClockedTime:
    """The ``time`` module with ``monotonic`` read from the driver's clock."""

    def __init__(self, now) -> None:
        self.monotonic = now

    def __getattr__(self, name: str):
        return getattr(_time, name)


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


class ChunkDeferrals:
    """Whether SGLang's latest ``PrefillAdder.add_chunked_req`` held the continuing chunk back
    (it returned without putting the request in ``can_run_list``: 0.5.23's SWA budget defers
    a chunk that does not fit) — kvspec's ``sched.chunk_deferred``."""

    def __init__(self, adder_cls) -> None:
        self.deferred = False
        real = adder_cls.add_chunked_req
        if getattr(real, "_kvspec_deferrals", None) is not None:  # one wrap per process
            real = real._kvspec_real
        deferrals = self

        def recording(adder, req, *args, **kwargs):
            result = real(adder, req, *args, **kwargs)
            deferrals.deferred = all(r is not req for r in adder.can_run_list)
            return result

        recording._kvspec_deferrals, recording._kvspec_real = self, real
        adder_cls.add_chunked_req = recording
