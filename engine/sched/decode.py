"""The decode-policy seam: how the running batch's decode step is sized, prepared, run and
committed. The scheduler is handed one ``DecodePolicy`` and never asks which it is: plain
decode (``PlainDecode``, here) or EAGLE v1 / v2 (engine/speculative/eagle.py).

Keeps: a policy's ``decode_tokens`` is exactly what its ``prepare_decode`` takes from the
allocator (so ``decode_fits`` is the memory check SGLang runs before a decode step);
``process_decode`` hands every request that finished to ``release``, once, in batch order.

Plain decode, per request of the batch:
    prepare   SWA window slide (every ``sliding_window`` steps), one slot at position
              ``kv_committed_len`` (committed and allocated +1), the DECODE forward
    process   the sampled token appended, the finish checked, a finished request released
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from engine.memory import KVMemory
from engine.model.runner import ForwardBatch, ForwardOutput, ModelRunner
from engine.request import Release, Req
from engine.sched.estimate import AllocEstimate
from engine.sched.forward import decode_forward


class DecodePolicy(Protocol):
    """One scheduler's decode step (SGLang: the model worker, or the EAGLE worker)."""

    spec_mode: str  # the view's sched.spec_mode: off | v1 | v2
    num_draft_tokens: int  # tokens one verify writes (0: no speculation)
    alloc_len: int  # KV one decode step may allocate per request (0: one slot)
    mixes_chunks: bool  # a prefill chunk may ride with this decode step (mixed chunk)

    @property
    def accept_hist(self) -> tuple[int, ...]:
        """Verifies by accepted draft count (empty without speculation)."""
        ...

    def decode_tokens(self, reqs: Sequence[Req]) -> int:
        """Tokens the next decode step of ``reqs`` takes from the allocator."""
        ...

    def prepare_decode(self, reqs: Sequence[Req], last_tokens: Mapping[Req, int]) -> ForwardBatch:
        """Allocate the step's KV and build its input (``last_tokens``: each request's
        latest sampled token, processed or not — the overlap future map)."""
        ...

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        """Run a prepared batch, extend or decode, through the model."""
        ...

    def process_decode(self, reqs: Sequence[Req], out: ForwardOutput, release: Release) -> None:
        """Commit the step's tokens; ``release`` each request that finished."""
        ...

    def before_release(self, req: Req) -> None:
        """Give back what a finished request reserved past its returned tokens."""
        ...

    def spec_state(self, req: Req) -> tuple[int, int] | None:
        """The worker's (verified seq_len, last accept_len) of a request; None without."""
        ...


def decode_fits(
    mem: KVMemory, policy: DecodePolicy, reqs: Sequence[Req], estimate: AllocEstimate | None = None
) -> bool:
    """Evict as needed; whether the next decode step of ``reqs`` fits (``check_decode_mem``).
    A check that passes is the decode estimate the step runs on (``estimate.decode``)."""
    need = policy.decode_tokens(reqs)
    mem.evict_for(need)
    fits = mem.allocator.available_size() >= need
    if fits and estimate is not None:
        estimate.decode = need
    return fits


class PlainDecode:
    """One token per request per step: SGLang's decode without speculation."""

    spec_mode = "off"
    num_draft_tokens = 0
    alloc_len = 0
    mixes_chunks = True
    accept_hist: tuple[int, ...] = ()

    def __init__(self, mem: KVMemory, runner: ModelRunner) -> None:
        self.mem, self.runner = mem, runner

    def decode_tokens(self, reqs: Sequence[Req]) -> int:
        """A page per request whose next position ``kv_allocated_len`` opens a page (SGLang
        ``new_page_count_next_decode`` × page size)."""
        page_size = self.mem.page_size
        if page_size == 1:
            return len(reqs)
        return sum(page_size for r in reqs if r.kv_allocated_len % page_size == 0)

    def prepare_decode(self, reqs: Sequence[Req], last_tokens: Mapping[Req, int]) -> ForwardBatch:
        self.mem.maybe_evict_swa(reqs)
        out = self.mem.alloc_for_decode(reqs)
        return decode_forward(reqs, out, self.mem, last_tokens)

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        return self.runner.forward(batch)

    def process_decode(self, reqs: Sequence[Req], out: ForwardOutput, release: Release) -> None:
        tokens, logprobs = out.next_token_ids.tolist(), out.next_token_logprobs.tolist()
        for req, token, logprob in zip(reqs, tokens, logprobs):
            if req.is_retracted or req.finished():  # overlap: finished by the previous batch
                continue
            req.append_output(token, logprob)
            req.check_finished()
            if req.finished():
                release(req)

    def before_release(self, req: Req) -> None:
        return None

    def spec_state(self, req: Req) -> tuple[int, int] | None:
        return None
