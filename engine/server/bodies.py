"""The native API's response bodies (SGLang's ``/generate`` JSON and SSE chunks).

Keeps: one builder for the final body and the streaming chunks, so a stream's last chunk and
the non-streaming answer are the same JSON; a matched stop string is trimmed from the text
unless ``no_stop_trim``; ``output_token_logprobs`` has one
``[logprob, token id, text]`` entry per output token (``text`` only with
``return_text_in_logprobs``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from engine.engine import GenerateResult
from engine.model.tokenizer import ByteTokenizer
from engine.server.loop import Progress
from engine.server.schemas import GenerateRequest

TOKENIZER = ByteTokenizer()


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def token_logprobs(
    ids: tuple[int, ...], logprobs: tuple[float, ...], with_text: bool
) -> list[list[Any]]:
    """SGLang's ``[logprob, token id, text]`` triples, one per token (``None`` for a token
    with no logprob)."""
    padded = list(logprobs) + [None] * (len(ids) - len(logprobs))
    return [
        [lp, tok, TOKENIZER.decode([tok], skip_special_tokens=False) if with_text else None]
        for lp, tok in zip(padded, ids)
    ]


def _body(
    rid: str,
    ids: tuple[int, ...],
    logprobs: tuple[float, ...],
    reason: dict[str, Any] | None,
    counts: tuple[int, int],
    req: GenerateRequest,
    started: float,
) -> dict[str, Any]:
    prompt, cached = counts
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": reason,
        "prompt_tokens": prompt,
        "completion_tokens": len(ids),
        "cached_tokens": cached,
        "e2e_latency": time.perf_counter() - started,
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = token_logprobs(ids, logprobs, req.return_text_in_logprobs)
    sampling = req.sampling_params
    text = TOKENIZER.decode(ids, skip_special_tokens=sampling.skip_special_tokens)
    if not sampling.no_stop_trim:
        text = trim_stop(text, reason)
    return {"text": text, "output_ids": list(ids), "meta_info": meta}


def trim_stop(text: str, reason: dict[str, Any] | None) -> str:
    """The text without the stop string that finished it (SGLang trims it; the output ids
    keep it)."""
    matched = (reason or {}).get("matched")
    if isinstance(matched, str) and matched and text.endswith(matched):
        return text[: -len(matched)]
    return text


def final_body(result: GenerateResult, req: GenerateRequest, started: float) -> dict[str, Any]:
    reason = result.finish_reason.to_json()
    counts = (result.prompt_tokens, result.cached_tokens)
    body = _body(
        result.rid, result.output_ids, result.output_token_logprobs, reason, counts, req, started
    )
    if req.return_logprob:
        body["meta_info"]["input_token_logprobs"] = input_logprobs(result, req)
    return body


def input_logprobs(result: GenerateResult, req: GenerateRequest) -> list[list[Any]]:
    """The prompt's ``[logprob, token id, text]`` from ``logprob_start_len`` on; the first
    token of a prompt has no context, so no logprob (None), as in SGLang."""
    triples = token_logprobs(
        result.input_token_ids, result.input_token_logprobs, req.return_text_in_logprobs
    )
    start = result.prompt_tokens - len(result.input_token_ids)
    if start == 0 and triples:
        triples[0][0] = None
    return triples


def progress_body(
    rid: str, event: Progress, req: GenerateRequest, started: float
) -> dict[str, Any]:
    counts = (event.prompt_tokens, event.cached_tokens)
    return _body(rid, event.output_ids, event.logprobs, None, counts, req, started)
