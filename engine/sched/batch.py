"""ScheduleBatch: the requests of one forward, and the KV writes that prepare it
(SGLang ``ScheduleBatch.prepare_for_extend / prepare_for_decode / mix_with_running``).

Keeps: every request of a prepared batch owns a request row, and the batch's ForwardBatch
(engine/sched/forward.py) names exactly the slots its forward writes; a decode step is
prepared by the scheduler's decode policy (engine/sched/decode.py), never decided here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from engine.memory import KVMemory
from engine.model.runner import ForwardBatch, ForwardMode
from engine.request import Req
from engine.sched.decode import DecodePolicy
from engine.sched.forward import concat_forward, extend_forward
from engine.view import ReuseView


@dataclass(slots=True, eq=False)
class ScheduleBatch:
    """A batch as the scheduler sees it. ``chunked_req`` is the request of this batch whose
    prefill is still truncated (it samples nothing); ``decoding_reqs`` the decode part of a
    mixed batch; ``forward`` the model input once prepared."""

    reqs: list[Req] = field(default_factory=list)
    mode: ForwardMode = ForwardMode.DECODE
    chunked_req: Req | None = None
    decoding_reqs: list[Req] | None = None
    batch_is_full: bool = False
    forward: ForwardBatch | None = None
    reused: tuple[ReuseView, ...] = ()  # extend requests that arrived with a row (reuse check)
    truncated_rids: tuple[str, ...] = ()  # extend requests prefilled only in part (a chunk)
    # every request asks for no output (max_new_tokens 0, no EAGLE): the batch never decodes
    # (SGLang's is_prefill_only: prefix caching, the frontend's select)
    is_prefill_only: bool = False

    @property
    def is_extend(self) -> bool:
        return self.mode.is_extend

    def is_empty(self) -> bool:
        return not self.reqs

    def batch_size(self) -> int:
        return len(self.reqs)

    def copy(self) -> ScheduleBatch:
        """What the overlap result queue keeps: the request list as it was at launch."""
        decoding = None if self.decoding_reqs is None else list(self.decoding_reqs)
        return ScheduleBatch(
            list(self.reqs), self.mode, self.chunked_req, decoding, self.batch_is_full, self.forward
        )

    def filter_batch(self, exclude: Collection[Req] = ()) -> None:
        """Drop finished requests and ``exclude`` (the in-flight chunked request)."""
        self.reqs = [r for r in self.reqs if not r.finished() and r not in exclude]

    def keep(self, indices: Sequence[int]) -> None:
        """Keep the requests at ``indices``, in that order (``filter_batch(keep_indices)``)."""
        self.reqs = [self.reqs[i] for i in indices]

    def merge_batch(self, other: ScheduleBatch) -> None:
        self.reqs = self.reqs + other.reqs
        self.is_prefill_only = self.is_prefill_only and other.is_prefill_only

    # ---- preparation: allocate KV, build the model input ----

    def prepare_for_extend(self, mem: KVMemory) -> None:
        """Allocate rows and KV for every request's ``[prefix_len, len(fill_ids))`` and
        build the EXTEND forward (``committed = allocated = seq_len`` afterwards)."""
        self.mode = ForwardMode.EXTEND
        self.reused = tuple(
            ReuseView(r.rid, r.req_pool_idx, r.is_chunked, r.kv_committed_len)
            for r in self.reqs
            if r.req_pool_idx is not None
        )
        self.truncated_rids = tuple(r.rid for r in self.reqs if len(r.fill_ids) < r.seqlen)
        prefix_lens = [len(r.prefix_indices) for r in self.reqs]
        out = mem.alloc_for_extend(self.reqs)
        for req, prefix in zip(self.reqs, prefix_lens):
            req.prepare_for_extend(prefix)
        self.forward = extend_forward(self.reqs, prefix_lens, out, mem, self.chunked_req)

    def prepare_for_decode(self, policy: DecodePolicy, last_tokens: Mapping[Req, int]) -> None:
        """The decode step of these requests, as ``policy`` prepares it (plain: SWA window
        slide, one slot at ``kv_committed_len`` each; EAGLE: the verify reservation)."""
        self.mode = ForwardMode.DECODE
        self.reused, self.truncated_rids = (), ()  # a running batch may be a former extend batch
        self.forward = policy.prepare_decode(self.reqs, last_tokens)

    def mix_with_running(self, running: ScheduleBatch) -> None:
        """Append a prepared decode batch to this prepared extend batch (mixed chunk)."""
        assert self.forward is not None and running.forward is not None
        self.mode = ForwardMode.MIXED
        self.forward = concat_forward(self.forward, running.forward)
        self.decoding_reqs = list(running.reqs)
        self.reqs = self.reqs + running.reqs
