"""The fake speculative runner of the vllm driver: after each step every decoding request gets
``k`` draft tokens (``Scheduler.update_draft_token_ids``, as vLLM's engine core hands over
the EAGLE proposer's proposals), and a verify accepts each draft with a seeded coin
(``accept_prob``, drawn from the request id and its computed length), reporting what vLLM's
rejection sampler reports: the accepted drafts, then the bonus token."""

from __future__ import annotations

import random

from vllm.v1.outputs import DraftTokenIds


class Speculation:
    def __init__(self, k: int, accept_prob: float) -> None:
        self.k, self.accept_prob = k, accept_prob
        self.verified_drafts = self.accepted_drafts = 0

    def verified(self, request, drafts: list[int], bonus: int) -> list[int]:
        """The tokens a verify of ``drafts`` samples: the accepted prefix, then ``bonus``."""
        coin = random.Random(f"{request.request_id}:{request.num_computed_tokens}")
        accepted = 0
        while accepted < len(drafts) and coin.random() < self.accept_prob:
            accepted += 1
        self.verified_drafts += len(drafts)
        self.accepted_drafts += accepted
        return [*drafts[:accepted], bonus]

    def proposals(self, sched, rids: list[str], token_at) -> DraftTokenIds:
        """``k`` draft tokens for each request of ``rids`` still decoding."""
        live = [
            r
            for r in rids
            if r in sched.requests
            and not sched.requests[r].is_finished()
            and not sched.requests[r].is_prefill_chunk
        ]
        return DraftTokenIds(live, [[token_at(r, j) for j in range(self.k)] for r in live])
