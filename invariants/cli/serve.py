"""`kvspec serve`: the engine behind SGLang's HTTP API, with the invariant checker attached.

Keeps: the checker runs at level 1 (record) inside the engine whatever ``--strict-mem-check``
says, so a violation never breaks a step half-way; at level 2 the monitor then stops
admitting work and ``/health`` answers 503 with the first violation (DESIGN.md decision 3);
at level 1 violations are only reported (``/invariants``, ``/metrics``); at 0 no checker
is attached. Session timeouts run on wall time.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engine.server.args import ServerArgs
from invariants.checking.checker import Checker, CheckerHook, Level, summarize
from invariants.cli.app import app

if TYPE_CHECKING:
    from fastapi import FastAPI

    from engine.server.monitor import Metric

MAX_REPORTED = 200  # violations listed in full by /invariants (all are counted)


class CheckerMonitor:
    """The server's monitor over a Checker (engine/server/monitor.py ``Monitor``)."""

    def __init__(self, checker: Checker, level: int) -> None:
        self.checker = checker
        self.level = level

    def report(self) -> dict[str, Any]:
        violations = self.checker.violations
        stats = self.checker.stats()
        return {
            "level": self.level,
            "num_violations": len(violations) + self.checker.dropped,
            "by_invariant": dict(summarize(violations)),
            "violations": [asdict(v) for v in violations[:MAX_REPORTED]],
            "evaluations": sum(s.evaluations for s in stats.values()),
            "num_invariants": len(stats),
        }

    def health(self) -> tuple[bool, str]:
        if self.stop_admitting():
            return False, f"invariant violated: {self.checker.violations[0]}"
        return True, ""

    def stop_admitting(self) -> bool:
        return self.level >= Level.STRICT and bool(self.checker.violations)

    def metrics(self) -> list[Metric]:
        from engine.server.monitor import Metric

        counts = summarize(self.checker.violations)
        evaluations = sum(s.evaluations for s in self.checker.stats().values())
        total = len(self.checker.violations) + self.checker.dropped
        return [
            Metric(
                "kvspec_violations",
                "Invariant violations recorded",
                "counter",
                (({}, float(total)),),
            ),
            Metric(
                "kvspec_invariant_violations",
                "Invariant violations recorded, per invariant",
                "counter",
                tuple(({"invariant": rid}, float(n)) for rid, n in sorted(counts.items())),
            ),
            Metric(
                "kvspec_checker_evaluations",
                "Invariant evaluations",
                "counter",
                (({}, float(evaluations)),),
            ),
            Metric(
                "kvspec_strict_level",
                "--strict-mem-check level",
                "gauge",
                (({}, float(self.level)),),
            ),
        ]


def serve_app(args: ServerArgs) -> FastAPI:
    """The app `kvspec serve` runs: an engine on wall time, the shipped catalog checked at
    every event (levels 1 and 2), the monitor behind /health, /invariants and /metrics."""
    from engine.engine import Engine
    from engine.hooks import WallClock
    from engine.server.app import build_app
    from engine.server.monitor import NullMonitor
    from invariants.checking.loader import shipped_catalog

    engine = Engine(args.engine_config(), clock=WallClock())
    if engine.strict_level == 0:
        application = build_app(engine, NullMonitor(), args)
        application.state.num_invariants = 0
        return application
    catalog = shipped_catalog()
    checker = Checker(catalog, Level.RECORD)
    engine.attach(CheckerHook(checker))
    application = build_app(engine, CheckerMonitor(checker, engine.strict_level), args)
    application.state.num_invariants = len(catalog)
    return application


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
ChunkedPrefillSize = Annotated[int, Opt(help="Chunk size; -1 turns chunked prefill off.")]
EnableMixedChunk = Annotated[bool, Opt(help="Decodes ride in prefill batches.")]
DisableOverlapSchedule = Annotated[bool, Opt(help="Turn the overlap scheduler off.")]
EnableStreamingSession = Annotated[bool, Opt(help="Allow streaming sessions.")]
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
    """Serve SGLang's native HTTP API (/generate, sessions, abort, flush) and OpenAI's (/v1)
    with the checker behind /invariants, /metrics and /health; prints a start-up line, logs
    every request at --log-level info, and on Ctrl-C aborts what still runs and stops at
    idle with exact accounting."""
    flags = dict(locals())  # first: the flags only
    del flags["log_level"]  # uvicorn's, not the engine's
    import uvicorn

    from engine.errors import ConfigError

    flags["chunked_prefill_size"] = None if chunked_prefill_size == -1 else chunked_prefill_size
    try:
        args = ServerArgs(**flags)
        application = serve_app(args)
    except ConfigError as exc:
        typer.echo(f"kvspec serve: {exc}", err=True)
        raise typer.Exit(2) from None
    if log_level not in LOG_LEVELS:
        typer.echo(f"kvspec serve: --log-level {log_level!r}: one of {', '.join(LOG_LEVELS)}")
        raise typer.Exit(2)
    typer.echo(startup_line(args, application.state.num_invariants))
    uvicorn.run(
        application, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=10
    )


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
