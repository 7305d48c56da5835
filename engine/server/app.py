"""The FastAPI app: SGLang's native HTTP API over one Engine (docs/sglang.md §3), plus
``/invariants`` (the live checker report) and ``/metrics`` (Prometheus text).

Keeps: handlers never touch the engine — every engine call is a command run on the loop
thread (engine/server/loop.py). Every error has one shape (engine/server/errors.py). Bad
input answers HTTP 400 with a message, as SGLang does (schema violations, unknown or
closing sessions, streaming-session rejections, prompts over the context length), and the
engine keeps running. A request the
engine finished at once with an error status (400) gets that status even when it asked to
stream. A streaming client that goes away aborts its request, so its KV returns. While the
monitor says stop (level 2, after a violation) or the loop died, new work and ``/health``
answer 503 with the reason.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, NamedTuple

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from engine.engine import Engine, GenerateResult
from engine.request import SamplingParams
from engine.server.args import ServerArgs
from engine.server.bodies import SSE_DONE, TOKENIZER, final_body, progress_body, sse
from engine.server.errors import add_api_key, add_error_handlers, error_body, error_response
from engine.server.loop import EngineLoop, Failure, Progress, Submission, Watch
from engine.server.metrics import engine_metrics, engine_state, render
from engine.server.monitor import Monitor, NullMonitor
from engine.server.openai_api import add_openai_routes
from engine.server.schemas import (
    AbortRequest,
    CloseSessionRequest,
    ErrorResponse,
    GenerateRequest,
    GenerateResponse,
    OpenSessionRequest,
)

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse},
    503: {"model": ErrorResponse},
}
DISCONNECT_GRACE_S = 1.0  # how long a next turn waits for a dropped stream's abort
FLUSH_DONE = "Cache flushed.\n"
FLUSH_REFUSED = (
    "Cache not flushed: requests are running or waiting (flush only happens when idle).\n"
)


class Started(NamedTuple):
    """A submitted request: its id, its events, and its result when already known."""

    rid: str
    watch: Watch
    result: GenerateResult | None


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

    async def start(self, submission: Submission, stream: bool) -> Started | JSONResponse:
        """Submit on the loop thread; unless ``stream``, wait for the result. An error answer
        (503 refused, 400 rejected, the engine's own abort status, 500 a loop failure)
        comes back as the response to send."""
        refused = await self.refusal()
        if refused is not None:
            return error_response(503, refused)
        await self.settle_disconnect(submission)
        watch = Watch(asyncio.get_running_loop(), stream=stream)
        try:
            rid, result = await self.loop.call(self.loop.start_request(submission, watch))
        except ValueError as exc:  # SessionError, a duplicate rid
            return error_response(400, str(exc))
        if result is None and not stream:  # a stream reports progress while it waits
            event = await watch.events.get()
            if isinstance(event, Failure):
                return error_response(500, event.message)
            assert isinstance(event, GenerateResult)
            result = event
        status = None if result is None else error_status(result)
        if status is not None:
            assert result is not None
            return error_response(status, result.finish_reason.message or "aborted")
        return Started(rid, watch, result)

    async def settle_disconnect(self, submission: Submission) -> None:
        """A next turn sent right after its client dropped the last one's stream must not
        race that stream's abort: while the session's live request is still a stream being
        served, wait for it to end (at most ``DISCONNECT_GRACE_S``) before the turn is
        judged. A turn sent while the last one really runs is then refused as before."""
        deadline = time.monotonic() + DISCONNECT_GRACE_S
        while await self.loop.call(self.loop.stream_blocking(submission)):
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.01)

    async def events(self, started: Started) -> AsyncGenerator[Progress | GenerateResult | Failure]:
        """A streamed request's progress, then its result (or a failure); a client gone
        before the end aborts the request, so its KV returns."""
        if started.result is not None:
            yield started.result
            return
        done = False
        try:
            while not done:
                event = await started.watch.events.get()
                done = not isinstance(event, Progress)
                yield event
        finally:
            if not done:
                self.loop.post(self.loop.abort(started.rid))

    async def generate(self, body: GenerateRequest) -> Response:
        session = body.session_params.model_dump() if body.session_params is not None else None
        prompts = [TOKENIZER.encode(p) if isinstance(p, str) else p for p in body.prompts()]
        template = Submission(
            [],
            body.sampling_params.engine_params(),
            body.rid or uuid.uuid4().hex,
            session,
            body.session_id,  # SGLang's top-level session id (#29436)
            body.return_logprob,
            body.logprob_start_len,
        )
        began = time.perf_counter()
        n = body.sampling_params.n
        started = await self.start_prompts(prompts, template, n, body.stream, body.is_list)
        if isinstance(started, Response):
            return started
        if body.stream:
            chunks = self.stream(started[0], body, began)
            return StreamingResponse(chunks, media_type="text/event-stream")
        bodies = [final_body(s.result, body, began) for s in started if s.result is not None]
        return JSONResponse(bodies if body.is_list else bodies[0])

    async def start_prompts(
        self, prompts: list[list[int]], template: Submission, n: int, stream: bool, listed: bool
    ) -> list[Started] | Response:
        """Each prompt ``n`` times, in order, submitted as ``template`` under its rid (``rid``
        alone, or ``rid-i`` when the answer is a list). For n > 1, SGLang's parallel sampling:
        each prompt is first cached by a ``max_new_tokens: 0`` request, so the samples find it
        cached."""
        rid, params = template.rid, template.sampling_params
        if n > 1:
            cache = replace(params, max_new_tokens=0, min_new_tokens=0)
            cached = await self.start_all(
                [Submission(p, cache, f"{rid}-prefix-{i}") for i, p in enumerate(prompts)], False
            )
            if isinstance(cached, Response):
                return cached
        prompts = [p for p in prompts for _ in range(n)]
        rids = [f"{rid}-{i}" for i in range(len(prompts))] if listed else [rid]
        subs = [replace(template, input_ids=p, rid=r) for p, r in zip(prompts, rids)]
        return await self.start_all(subs, stream)

    async def start_all(self, subs: list[Submission], stream: bool) -> list[Started] | Response:
        """Start every submission; an error of any one is the answer (the others aborted)."""
        started = await asyncio.gather(*(self.start(s, stream) for s in subs))
        failed = [s for s in started if isinstance(s, Response)]
        if not failed:
            return [s for s in started if isinstance(s, Started)]
        for s in started:
            if isinstance(s, Started) and s.result is None:
                self.loop.post(self.loop.abort(s.rid))
        return failed[0]

    async def stream(
        self, started: Started, body: GenerateRequest, began: float
    ) -> AsyncGenerator[bytes]:
        """SSE chunks (cumulative text and ids) until the final one, then ``[DONE]``."""
        async for event in self.events(started):
            if isinstance(event, Failure):
                yield sse(error_body(500, event.message))
            elif isinstance(event, Progress):
                yield sse(progress_body(started.rid, event, body, began))
            else:
                yield sse(final_body(event, body, began))
        yield SSE_DONE


def model_info(args: ServerArgs) -> dict[str, Any]:
    return {
        "model_path": f"kvspec-{args.model}",
        "tokenizer_path": "kvspec-bytes",
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": args.model,
        "architectures": [f"Kvspec{args.model.capitalize()}ForCausalLM"],
    }


def error_status(result: GenerateResult) -> int | None:
    """The HTTP status of an aborted result that carries one (400, 503, …); None: 200."""
    reason = result.finish_reason
    return reason.status_code if reason.kind == "abort" and reason.status_code else None


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
    add_error_handlers(app)
    if server.args.api_key is not None:
        add_api_key(app, server.args.api_key)
    _add_generate_routes(app, server)
    _add_session_routes(app, server)
    _add_status_routes(app, server)
    add_openai_routes(app, server)
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
        response_model=GenerateResponse | list[GenerateResponse],
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

    _add_info_routes(app, server)


def _add_info_routes(app: FastAPI, server: Server) -> None:
    loop = server.loop

    @app.get("/health_generate", responses={503: {"model": ErrorResponse}})
    async def health_generate() -> Response:
        """200 once a one-token generation ran through the engine (SGLang's deep health)."""
        probe = Submission([TOKENIZER.bos_token_id], SamplingParams(max_new_tokens=1))
        started = await server.start(probe, stream=False)
        if not isinstance(started, Started):
            failed = bytes(started.body).decode()
            return error_response(503, f"health generation failed: {failed}")
        return Response(status_code=200)

    @app.get("/get_server_info")
    async def get_server_info() -> dict[str, Any]:
        """The server arguments and the engine's state (SGLang's ``internal_states``)."""
        state = await loop.call(engine_state)
        return {
            "server_args": server.args.public(),
            "version": app.version,
            "internal_states": [state],
        }

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        """``/get_server_info`` under SGLang's newer name."""
        return await get_server_info()

    @app.get("/get_model_info")
    async def get_model_info() -> dict[str, Any]:
        """What SGLang's frontend (``RuntimeEndpoint``) reads first: the model path (its chat
        template is looked up by it) and that the model generates."""
        return model_info(server.args)
