"""`kvspec serve`: the engine behind SGLang's HTTP API and OpenAI's, with the invariant
checker attached (the app: invariants/checked_server.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from engine.server.args import ServerArgs
from invariants.checked_server import serve_app
from invariants.cli.app import app

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["serve", "serve_app", "startup_line"]


def startup_line(args: ServerArgs, num_invariants: int) -> str:
    """What `kvspec serve` prints before it listens: where, what, and how it is checked."""
    cfg = args.engine_config()
    return (
        f"kvspec serve: http://{args.host}:{args.port} · model {args.model} · "
        f"page size {args.page_size} · attention {args.attention} · "
        f"overlap {'on' if cfg.enable_overlap else 'off'} · "
        f"speculative {args.speculative_algorithm or 'off'} · "
        f"strict level {args.strict_mem_check} ({num_invariants} invariants checked at every "
        f"scheduler event) · native API, /v1 (OpenAI), /invariants, /metrics"
    )


Opt = typer.Option
DEFAULTS = ServerArgs()  # the flags' defaults are the engine's own (engine/server/args.py)


Host = Annotated[str, Opt(help="Address to bind (loopback by default).")]
Port = Annotated[int, Opt(help="TCP port.")]
Model = Annotated[str, Opt(help="sim | tiny")]
Seed = Annotated[int, Opt(help="The one seed of the engine.")]
PageSize = Annotated[int, Opt(help="Tokens per KV page.")]
ChunkedPrefillSize = Annotated[int | None, Opt(help="Chunk size; -1 turns chunked prefill off.")]
EnableMixedChunk = Annotated[bool, Opt(help="Decodes ride in prefill batches.")]
DisableOverlapSchedule = Annotated[bool, Opt(help="Turn the overlap scheduler off.")]
EnableStreamingSession = Annotated[bool, Opt(help="Allow streaming sessions.")]
EnableSessionRadixCache = Annotated[
    bool, Opt(help="Sessions tag evictable radix KV (session_id needs no open).")
]
SpeculativeAlgorithm = Annotated[str | None, Opt(help="EAGLE (v1) | EAGLE_V2.")]
SpeculativeNumSteps = Annotated[int, Opt(help="EAGLE draft steps.")]
SpeculativeEagleTopk = Annotated[int, Opt(help="EAGLE top-k (1: a chain).")]
SpeculativeNumDraftTokens = Annotated[int, Opt(help="Tokens one verify checks.")]
Attention = Annotated[str, Opt(help="mha | swa | mla")]
SlidingWindow = Annotated[int, Opt(help="Window of the SWA layers (--attention swa).")]
MaxRunningRequests = Annotated[int | None, Opt(help="Running-request limit.")]
ContextLength = Annotated[int, Opt(help="Longest prompt + completion.")]
MaxTotalTokens = Annotated[int, Opt(help="KV pool size in tokens.")]
TestRetract = Annotated[bool, Opt(help="Force a retract every 3 forwards (SGLANG_TEST_RETRACT).")]
StrictMemCheck = Annotated[int, Opt(help="0 off, 1 record, 2 stop admitting on a violation.")]
ApiKey = Annotated[str | None, Opt(help="Require 'Authorization: Bearer KEY'.")]
LogLevel = Annotated[
    str, Opt(help="uvicorn's log level: info logs every request (access log); warning does not.")
]


@app.command()
def serve(
    host: Host = DEFAULTS.host,
    port: Port = DEFAULTS.port,
    model: Model = DEFAULTS.model,
    seed: Seed = DEFAULTS.seed,
    page_size: PageSize = DEFAULTS.page_size,
    chunked_prefill_size: ChunkedPrefillSize = DEFAULTS.chunked_prefill_size,
    enable_mixed_chunk: EnableMixedChunk = DEFAULTS.enable_mixed_chunk,
    disable_overlap_schedule: DisableOverlapSchedule = DEFAULTS.disable_overlap_schedule,
    enable_streaming_session: EnableStreamingSession = DEFAULTS.enable_streaming_session,
    enable_session_radix_cache: EnableSessionRadixCache = DEFAULTS.enable_session_radix_cache,
    speculative_algorithm: SpeculativeAlgorithm = DEFAULTS.speculative_algorithm,
    speculative_num_steps: SpeculativeNumSteps = DEFAULTS.speculative_num_steps,
    speculative_eagle_topk: SpeculativeEagleTopk = DEFAULTS.speculative_eagle_topk,
    speculative_num_draft_tokens: SpeculativeNumDraftTokens = DEFAULTS.speculative_num_draft_tokens,
    attention: Attention = DEFAULTS.attention,
    sliding_window: SlidingWindow = DEFAULTS.sliding_window,
    max_running_requests: MaxRunningRequests = DEFAULTS.max_running_requests,
    context_length: ContextLength = DEFAULTS.context_length,
    max_total_tokens: MaxTotalTokens = DEFAULTS.max_total_tokens,
    test_retract: TestRetract = DEFAULTS.test_retract,
    strict_mem_check: StrictMemCheck = DEFAULTS.strict_mem_check,
    api_key: ApiKey = DEFAULTS.api_key,
    log_level: LogLevel = "info",
) -> None:
    """Serve SGLang's native API and OpenAI's (/v1), checked behind /invariants, /metrics and
    /health; prints a start-up line, logs requests at --log-level info, and on Ctrl-C aborts
    what still runs and stops at idle with exact accounting."""
    flags = dict(locals())  # first: the flags only
    del flags["log_level"]  # uvicorn's, not the engine's
    from engine.errors import ConfigError

    flags["chunked_prefill_size"] = None if chunked_prefill_size == -1 else chunked_prefill_size
    try:
        args = ServerArgs(**flags)
        application = serve_app(args)
    except ConfigError as exc:
        typer.echo(f"kvspec serve: {exc}", err=True)
        raise typer.Exit(2) from None
    _run(application, args, log_level)


def _run(application: FastAPI, args: ServerArgs, log_level: str) -> None:
    """Print the start-up line and serve until Ctrl-C (then the engine loop drains)."""
    import uvicorn

    if log_level not in LOG_LEVELS:
        typer.echo(f"kvspec serve: --log-level {log_level!r}: one of {', '.join(LOG_LEVELS)}")
        raise typer.Exit(2)
    typer.echo(startup_line(args, application.state.num_invariants))
    uvicorn.run(
        application,
        host=args.host,
        port=args.port,
        log_level=log_level,
        timeout_graceful_shutdown=10,
    )


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
