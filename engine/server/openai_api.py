"""OpenAI's API over the same engine: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions``, streamed (SSE chunks of new text, ``data: [DONE]``) or not, with
``usage`` and ``prompt_tokens_details.cached_tokens``.

Keeps: these routes add nothing to the engine's path — each prompt is one submission
through ``Server.start``, exactly like ``/generate``, so it runs under the whole catalog at the
server's strict level, is refused while the monitor says stop, and a client gone mid-stream
aborts it. Errors have the one shape of engine/server/errors.py (OpenAI's). A streamed text
never splits a UTF-8 character: bytes that do not decode yet wait for the next chunk.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.engine import GenerateResult
from engine.server.bodies import SSE_DONE, TOKENIZER, sse, trim_stop
from engine.server.errors import error_body
from engine.server.loop import Failure, Submission
from engine.server.openai_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    _Sampling,
    chat_prompt,
)


def add_openai_routes(app: FastAPI, server: Any) -> None:
    """``server``: engine/server/app.py's ``Server`` (its ``start_prompts`` and ``events``)."""
    model = f"kvspec-{server.args.model}"

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        """The one model this server runs."""
        card = {
            "id": model,
            "object": "model",
            "created": 0,
            "owned_by": "kvspec",
            "root": model,
            "max_model_len": server.args.context_length,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Response:
        """Text completion of a prompt (text or ids) or of a list of prompts."""
        prompts = [_ids(p) for p in body.prompts()]
        return await _answer(server, body, prompts, body.budget(), Shape("text_completion"))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        """The messages through the byte-level chat template, answered as the assistant."""
        prompt = [_ids(chat_prompt(body.messages))]
        return await _answer(server, body, prompt, body.budget(), Shape("chat.completion"))


class Shape:
    """How one kind of answer looks: its object names, choices and chunks."""

    def __init__(self, kind: str) -> None:
        self.kind, self.chat = kind, kind == "chat.completion"
        self.prefix = "chatcmpl-" if self.chat else "cmpl-"

    def choice(self, index: int, text: str, reason: str | None, matched: Any) -> dict[str, Any]:
        base: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": reason}
        if reason is not None:
            base["matched_stop"] = matched
        if self.chat:
            return {**base, "message": {"role": "assistant", "content": text}}
        return {**base, "text": text}

    def delta(self, text: str | None, reason: str | None, first: bool) -> dict[str, Any]:
        base: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if not self.chat:
            return {**base, "text": text or ""}
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        return {**base, "delta": delta}

    def envelope(self, rid: str, model: str, chunk: bool = False) -> dict[str, Any]:
        kind = self.kind + (".chunk" if chunk and self.chat else "")
        return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


def _ids(prompt: str | list[int]) -> list[int]:
    return TOKENIZER.encode(prompt) if isinstance(prompt, str) else prompt


def _usage(results: list[GenerateResult]) -> dict[str, Any]:
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(len(r.output_ids) for r in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in results)},
    }


def _finish(result: GenerateResult) -> tuple[str, Any]:
    reason = result.finish_reason
    return reason.kind, reason.matched


def _text(ids: tuple[int, ...], result: GenerateResult | None) -> str:
    text = TOKENIZER.decode(ids)
    return text if result is None else trim_stop(text, result.finish_reason.to_json())


async def _answer(
    server: Any, body: _Sampling, prompts: list[list[int]], budget: int, shape: Shape
) -> Response:
    """Start every prompt; an error of any one is the answer (the others are aborted)."""
    rid = body.rid or f"{shape.prefix}{uuid.uuid4().hex}"
    template = Submission([], body.engine_params(budget), rid, session_id=body.session_id)
    listed = len(prompts) * body.n > 1
    started = await server.start_prompts(prompts, template, body.n, body.stream, listed)
    if isinstance(started, Response):
        return started
    if body.stream:
        chunks = _stream(server, started[0], body, shape)
        return StreamingResponse(chunks, media_type="text/event-stream")
    results = [s.result for s in started]
    choices = [shape.choice(i, _text(r.output_ids, r), *_finish(r)) for i, r in enumerate(results)]
    answer = {**shape.envelope(rid, body.model), "choices": choices, "usage": _usage(results)}
    return JSONResponse(answer)


async def _stream(
    server: Any, started: Any, body: _Sampling, shape: Shape
) -> AsyncGenerator[bytes]:
    """One chunk per batch of new text; the last carries the finish reason (then ``usage``
    when ``stream_options.include_usage``), then ``[DONE]``."""
    sent, first = "", True
    envelope = shape.envelope(started.rid, body.model, chunk=True)
    async for event in server.events(started):
        if isinstance(event, Failure):
            yield sse(error_body(500, event.message))
            break
        done = isinstance(event, GenerateResult)
        text = _text(event.output_ids, event if done else None)
        if not done and text.endswith("\ufffd"):
            text = text[:-1]  # a UTF-8 character still arriving
        new, sent = text[len(sent) :], text
        if new or first:
            yield sse({**envelope, "choices": [shape.delta(new, None, first)]})
            first = False
        if done:
            reason, _ = _finish(event)
            yield sse({**envelope, "choices": [shape.delta(None, reason, False)]})
            if body.include_usage:
                yield sse({**envelope, "choices": [], "usage": _usage([event])})
    yield SSE_DONE


__all__ = ["add_openai_routes"]
