"""Penalizer slips (issue 18: min_new_tokens, frequency and presence penalties): each the
fixed body of one function of engine/model/penalties.py with one change (both models find
their penalized rows through ``penalized_rows``, which calls them).

Keeps: each buggy body below is the fixed function with exactly one change (the comment on
each says which); nothing else differs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.model import penalties
from engine.model.runner import ForwardBatch, ForwardMode
from engine.request import Req
from invariants.mutants.base import Mutant, ids, swap


def rows_from_round_start(batch: ForwardBatch) -> tuple[list[int], list[int]]:
    """SGLang's verify (``orchestrator.apply(logits, repeat=...)``): every draft position
    gets the penalties as of the round's root, as if the drafts before it were not output."""
    if batch.mode is ForwardMode.TARGET_VERIFY:
        owners = np.repeat(np.arange(batch.batch_size), batch.extend_lens).tolist()
        return owners, np.repeat(
            batch.prefix_lens + 1, batch.extend_lens
        ).tolist()  # fix: positions + 1
    return list(range(batch.batch_size)), batch.seq_lens.tolist()


def output_with_prompt(req: Req, context: Sequence[int], end: int) -> Sequence[int]:
    """The prompt counted as output (vLLM's repetition penalty counts the prompt; SGLang's
    frequency and presence penalties and its min_new_tokens count only the output)."""
    return context[: max(end, len(req.origin_input_ids))]  # fix: from len(origin_input_ids)


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "penalties-verify-from-round-start",
        "issue 18 (sglang penaltylib orchestrator.apply repeat)",
        "an EAGLE verify penalizes every draft position as of the round's root",
        lambda: swap(penalties, "output_rows", rows_from_round_start),
        "penalties-verify-round-start.yaml",
        ids("response.tokens_match_uncached_reference"),
    ),
    Mutant(
        "penalties-count-the-prompt",
        "issue 18 (sglang penaltylib counts output tokens only)",
        "the penalizers count the prompt's tokens as output: min_new_tokens is met at once",
        lambda: swap(penalties, "output_before", output_with_prompt),
        "penalties-count-prompt.yaml",
        ids(
            "response.tokens_match_uncached_reference",
            "response.no_stop_token_before_min_new_tokens",
        ),
    ),
)
