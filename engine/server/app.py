"""The FastAPI app: SGLang's native HTTP API over one Engine (research/sglang.md §3), plus
``/invariants`` (the live checker report) and ``/metrics`` (Prometheus text).

Keeps: handlers never touch the engine — every engine call is a command run on the loop
thread (engine/server/loop.py). Bad input answers HTTP 400 ``{"error": {"message": …}}``
as SGLang does (schema violations, unknown or closing sessions, streaming-session
rejections, prompts over the context length), and the engine keeps running. A request the
engine finished at once with an error status (400) gets that status even when it asked to
stream. A streaming client that goes away aborts its request, so its KV returns. While the
monitor says stop (level 2, after a violation) or the loop died, new work and ``/health``
answer 503 with the reason.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from engine.engine import Engine, GenerateResult
from engine.model.tokenizer import ByteTokenizer
from engine.server.args import ServerArgs
from engine.server.loop import EngineLoop, Failure, Progress, Submission, Watch
from engine.server.metrics import engine_metrics, engine_state, render
from engine.server.monitor import Monitor, NullMonitor
from engine.server.schemas import (
    AbortRequest,
    CloseSessionRequest,
    ErrorResponse,
    GenerateRequest,
    GenerateResponse,
    OpenSessionRequest,
)

TOKENIZER = ByteTokenizer()
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse},
    503: {"model": ErrorResponse},
}
FLUSH_DONE = "Cache flushed.\n"
FLUSH_REFUSED = (
    "Cache not flushed: requests are running or waiting (flush only happens when idle).\n"
)


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def validation_message(exc: RequestValidationError) -> str:
    """One line per schema error: ``where: what``."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


class Server:
    """The routes' shared state: the loop, the monitor, the arguments."""

    def __init__(self, engine: Engine, monitor: Monitor, args: ServerArgs) -> None:
        self.loop = EngineLoop(engine)
        self.monitor = monitor
        self.args = args

    async def refusal(self) -> str | None:
        """Why new work is refused now (the loop died, or the monitor says stop), or None."""
        if self.loop.fatal is not None:
            return self.loop.fatal
        stop, (_, why) = await self.loop.call(
            lambda _: (self.monitor.stop_admitting(), self.monitor.health())
        )
        return f"not admitting new work: {why}" if stop else None

    async def generate(self, body: GenerateRequest) -> Response:
        refused = await self.refusal()
        if refused is not None:
            return error_response(503, refused)
        ids = TOKENIZER.encode(body.text) if body.text is not None else list(body.input_ids or ())
        session = body.session_params.model_dump() if body.session_params is not None else None
        submission = Submission(
            ids,
            body.sampling_params.engine_params(),
            body.rid or uuid.uuid4().hex,
            session,
            body.return_logprob,
            body.logprob_start_len,
        )
        watch, started = Watch(asyncio.get_running_loop(), stream=body.stream), time.perf_counter()
        try:
            rid, result = await self.loop.call(self.loop.start_request(submission, watch))
        except ValueError as exc:  # SessionError, a duplicate rid
            return error_response(400, str(exc))
        if result is None and not body.stream:  # a stream reports progress while it waits
            event = await watch.events.get()
            if isinstance(event, Failure):
                return error_response(500, event.message)
            assert isinstance(event, GenerateResult)
            result = event
        status = None if result is None else error_status(result)
        if status is not None:
            return error_response(status, result.finish_reason.message or "aborted")
        if body.stream:
            return StreamingResponse(
                self.stream(rid, watch, body, started, result), media_type="text/event-stream"
            )
        assert result is not None
        return JSONResponse(final_body(result, body, started))

    async def stream(
        self,
        rid: str,
        watch: Watch,
        body: GenerateRequest,
        started: float,
        result: GenerateResult | None,
    ) -> AsyncGenerator[bytes, None]:
        """SSE chunks (cumulative text and ids) until the final one, then ``[DONE]``; a
        client gone before the end aborts the request."""
        done = result is not None
        try:
            while result is None:
                event = await watch.events.get()
                if isinstance(event, Failure):
                    done = True
                    yield sse({"error": {"message": event.message}})
                    break
                if isinstance(event, GenerateResult):
                    result, done = event, True
                elif isinstance(event, Progress):
                    yield sse(progress_body(rid, event, body, started))
            if result is not None:
                yield sse(final_body(result, body, started))
            yield b"data: [DONE]\n\n"
        finally:
            if not done:
                self.loop.post(self.loop.abort(rid))


def error_status(result: GenerateResult) -> int | None:
    """The HTTP status of an aborted result that carries one (400, 503, …); None: 200."""
    reason = result.finish_reason
    return reason.status_code if reason.kind == "abort" and reason.status_code else None


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _logprobs(ids: tuple[int, ...], logprobs: tuple[float, ...]) -> list[list[Any]]:
    """SGLang's ``[logprob, token id, text]`` triples (text not requested: None); a token
    the engine has no logprob for (EAGLE's accepted drafts) gets None."""
    padded = list(logprobs) + [None] * (len(ids) - len(logprobs))
    return [[lp, tok, None] for lp, tok in zip(padded, ids)]


def _body(
    rid: str,
    ids: tuple[int, ...],
    logprobs: tuple[float, ...],
    reason: dict[str, Any] | None,
    prompt: int,
    cached: int,
    req: GenerateRequest,
    started: float,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": reason,
        "prompt_tokens": prompt,
        "completion_tokens": len(ids),
        "cached_tokens": cached,
        "e2e_latency": time.perf_counter() - started,
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = _logprobs(ids, logprobs)
    text = TOKENIZER.decode(ids, skip_special_tokens=req.sampling_params.skip_special_tokens)
    return {"text": text, "output_ids": list(ids), "meta_info": meta}


def final_body(result: GenerateResult, req: GenerateRequest, started: float) -> dict[str, Any]:
    return _body(
        result.rid,
        result.output_ids,
        result.output_token_logprobs,
        result.finish_reason.to_json(),
        result.prompt_tokens,
        result.cached_tokens,
        req,
        started,
    )


def progress_body(
    rid: str, event: Progress, req: GenerateRequest, started: float
) -> dict[str, Any]:
    return _body(
        rid,
        event.output_ids,
        event.logprobs,
        None,
        event.prompt_tokens,
        event.cached_tokens,
        req,
        started,
    )


def build_app(
    engine: Engine, monitor: Monitor | None = None, args: ServerArgs | None = None
) -> FastAPI:
    """The app over ``engine`` (its loop thread runs while the app is served)."""
    server = Server(engine, monitor or NullMonitor(), args or ServerArgs())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.loop.start()
        yield
        server.loop.stop()

    app = FastAPI(title="kvspec", version="0.1.0", lifespan=lifespan)
    app.state.server = server
    _add_error_handlers(app)
    if server.args.api_key is not None:
        _add_api_key(app, server.args.api_key)
    _add_generate_routes(app, server)
    _add_session_routes(app, server)
    _add_status_routes(app, server)
    return app


def add_routes(app: FastAPI, path: str, endpoint: Any, methods: tuple[str, ...], **kw: Any) -> None:
    """One route per method, so each OpenAPI operation has its own id."""
    for method in methods:
        app.add_api_route(
            path,
            endpoint,
            methods=[method],
            operation_id=f"{endpoint.__name__}_{method.lower()}",
            **kw,
        )


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, validation_message(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))


def _add_api_key(app: FastAPI, api_key: str) -> None:
    """SGLang's API-key middleware: every route but /health* and /metrics needs the bearer."""

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Response:
        path = request.url.path
        if request.method == "OPTIONS" or path.startswith(("/health", "/metrics")):
            return await call_next(request)
        if request.headers.get("Authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)


def _add_generate_routes(app: FastAPI, server: Server) -> None:
    loop = server.loop

    async def generate(body: GenerateRequest) -> Response:
        """Generate for ``text`` or ``input_ids`` (a session turn with ``session_params``);
        ``stream`` answers SSE ending in ``data: [DONE]``."""
        return await server.generate(body)

    add_routes(
        app,
        "/generate",
        generate,
        ("POST", "PUT"),
        response_model=GenerateResponse,
        responses=ERRORS,
    )

    @app.post("/abort_request")
    async def abort_request(body: AbortRequest) -> Response:
        """Abort one request by id, or all of them (``abort_all``); always 200."""
        if body.rid or body.abort_all:
            await loop.call(loop.abort(body.rid, body.abort_all))
        return Response(status_code=200)

    async def flush_cache() -> Response:
        """Empty the prefix cache and every session slot — only when fully idle (else 400)."""
        flushed = await loop.call(lambda engine: engine.flush_cache())
        return Response(
            FLUSH_DONE if flushed else FLUSH_REFUSED, status_code=200 if flushed else 400
        )

    add_routes(app, "/flush_cache", flush_cache, ("GET", "POST"))


def _add_session_routes(app: FastAPI, server: Server) -> None:
    loop = server.loop

    async def open_session(body: OpenSessionRequest) -> Response:
        """Open a session; answers its id (a JSON string)."""
        refused = await server.refusal()
        if refused is not None:
            return error_response(503, refused)
        try:
            sid = await loop.call(
                lambda engine: engine.open_session(
                    body.capacity_of_str_len, body.session_id, bool(body.streaming), body.timeout
                )
            )
        except ValueError as exc:  # SessionError: duplicate id, streaming disabled
            return error_response(400, str(exc))
        return JSONResponse(sid)

    async def close_session(body: CloseSessionRequest) -> Response:
        """Close a session (deferred while its streaming turn runs); always 200, as SGLang."""
        await loop.call(lambda engine: engine.close_session(body.session_id))
        return Response(status_code=200)

    add_routes(app, "/open_session", open_session, ("GET", "POST"), responses=ERRORS)
    add_routes(app, "/close_session", close_session, ("GET", "POST"))


def _add_status_routes(app: FastAPI, server: Server) -> None:
    loop, monitor = server.loop, server.monitor

    @app.get("/health", responses={503: {"model": ErrorResponse}})
    async def health() -> Response:
        """200 while healthy; 503 with the reason after a stopping violation or a loop error."""
        if loop.fatal is not None:
            return error_response(503, loop.fatal)
        ok, why = await loop.call(lambda _: monitor.health())
        return Response(status_code=200) if ok else error_response(503, why)

    @app.get("/get_server_info")
    async def get_server_info() -> dict[str, Any]:
        """The server arguments and the engine's state (SGLang's ``internal_states``)."""
        state = await loop.call(engine_state)
        return {
            "server_args": server.args.public(),
            "version": app.version,
            "internal_states": [state],
        }

    @app.get("/invariants")
    async def invariants() -> dict[str, Any]:
        """The live checker report, and the pools' counters and census right now."""
        state, report, (ok, why) = await loop.call(
            lambda e: (engine_state(e), monitor.report(), monitor.health())
        )
        return {
            "healthy": ok and loop.fatal is None,
            "reason": loop.fatal or why,
            "engine": state,
            "checker": report,
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text: pool buckets, census findings, scheduler counters, violations."""
        families = await loop.call(lambda e: engine_metrics(engine_state(e)) + monitor.metrics())
        return Response(render(families), media_type=CONTENT_TYPE_LATEST)
