"""SGLang's logit penalizers (``sampling/penaltylib``): ``min_new_tokens`` masks the stop
tokens (EOS included, even with ``ignore_eos``) until that many tokens were output;
``frequency_penalty`` subtracts ``f × count`` and ``presence_penalty`` ``p`` from the score of
every token already output. Greedy: the token is the argmax of the penalized scores.

Keeps: a penalty is a function of the request's parameters and the tokens it output before
the position sampled (read from the context, never from batch state), so chunking, retract,
overlap or speculation cannot change a token — the token oracle's reference applies the same
function. (SGLang keeps the counts in the batch's penalizer state instead: 0.5.23 builds it at
zero for every new prefill batch, so a retracted request readmitted counts its output from
there, and a verify applies the round's first penalties to every draft position
(``orchestrator.apply(repeat=...)``); the zoo plants the second as a mutant.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from engine.model.runner import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from engine.request import Req


@dataclass(frozen=True, slots=True)
class Penalties:
    """What one request's penalizers do to its scores."""

    min_new_tokens: int = 0
    stop_ids: frozenset[int] = frozenset()  # masked while fewer than min_new_tokens output
    frequency: float = 0.0
    presence: float = 0.0

    @classmethod
    def of(cls, req: Req) -> Penalties | None:
        """The request's penalties; None when every penalizer is neutral (the fast path)."""
        params = req.sampling_params
        if not params.is_penalized:
            return None
        return cls(
            params.min_new_tokens,
            frozenset(params.stop_token_ids) | req.eos_token_ids,
            params.frequency_penalty,
            params.presence_penalty,
        )

    def apply(self, scores: np.ndarray, output: Sequence[int]) -> np.ndarray:
        """``scores`` ([vocab] floats) penalized after ``output``, the tokens this request
        output before the position sampled (a new array; ``scores`` is left as it was)."""
        out = np.array(scores, dtype=np.float64)
        if len(output) < self.min_new_tokens:
            stops = [t for t in self.stop_ids if t < len(out)]
            out[stops] = -np.inf
        if (self.frequency or self.presence) and len(output):
            tokens, counts = np.unique(np.asarray(output, dtype=np.int64), return_counts=True)
            inside = tokens < len(out)
            tokens, counts = tokens[inside], counts[inside]
            out[tokens] -= self.frequency * counts + self.presence
        return out

    def pick(self, scores: np.ndarray, output: Sequence[int]) -> int:
        """The greedy token after ``output`` (the first best on a tie, as torch's argmax)."""
        return int(np.argmax(self.apply(scores, output)))


def penalties_of(reqs: Sequence[Req]) -> list[Penalties | None] | None:
    """Each request's penalties, or None when no request of the batch has any."""
    if not any(r.sampling_params.is_penalized for r in reqs):
        return None
    return [Penalties.of(r) for r in reqs]


def output_before(req: Req, context: Sequence[int], end: int) -> Sequence[int]:
    """The tokens ``req`` output before position ``end`` of its ``context``: its prompt is
    ``origin_input_ids`` (a session turn's history included), so its output starts there."""
    return context[len(req.origin_input_ids) : max(end, len(req.origin_input_ids))]


def output_rows(batch: ForwardBatch) -> tuple[list[int], list[int]]:
    """For each output of ``batch``: the request it belongs to and the context length it is
    sampled after (a verify has an output after every input token)."""
    if batch.mode is ForwardMode.TARGET_VERIFY:
        owners = np.repeat(np.arange(batch.batch_size), batch.extend_lens).tolist()
        return owners, (batch.positions + 1).tolist()
    return list(range(batch.batch_size)), batch.seq_lens.tolist()


def penalized_rows(
    batch: ForwardBatch,
    penalties: list[Penalties | None],
    context_of: Callable[[int], Sequence[int]],
) -> Iterator[tuple[int, Penalties, Sequence[int]]]:
    """Each output row of a penalized request: the row, its penalties and the tokens the
    request output before it. ``context_of(i)``: request ``i``'s tokens through the batch's
    (asked once per request)."""
    contexts = cache(context_of)
    for row, (i, end) in enumerate(zip(*output_rows(batch))):
        pen = penalties[i]
        if pen is not None:
            yield row, pen, output_before(batch.reqs[i], contexts(i), end)


def repick(
    batch: ForwardBatch,
    penalties: list[Penalties | None],
    logp: np.ndarray,
    out: tuple[np.ndarray, np.ndarray],
    context_of: Callable[[int], Sequence[int]],
) -> None:
    """Re-pick in place each output of a penalized request (``out``: tokens, logprobs): the
    argmax of its penalized log-probs ``logp`` ([outputs, vocab]) and that token's logprob
    under the penalized distribution (SGLang's logprobs come after the penalizers)."""
    tokens, logprobs = out
    for row, pen, output in penalized_rows(batch, penalties, context_of):
        scores = pen.apply(logp[row], output)
        best = int(np.argmax(scores))  # its logprob: top - logsumexp = -log Σ exp(s - top)
        tokens[row], logprobs[row] = best, -np.log(np.exp(scores - scores[best]).sum())
