"""The engine loop thread: the only thread that touches the engine (and its observers).

Keeps: HTTP handlers never call the engine — they hand a command (a function of the engine)
to a thread-safe queue and await its ``concurrent.futures.Future`` (wrapped as an asyncio
future, resolved through ``call_soon_threadsafe``). The thread steps the engine while it has
work and sleeps on the command queue when idle (no busy spin; a stalled scheduler backs off
too; open sessions with a timeout or a deferred close wake it twice a second so they are
reaped). After every command batch and every step it publishes each watched request's new
tokens and its final result to that request's asyncio queue; a result is popped from the
engine exactly once. An exception out of ``Engine.step`` is fatal: the loop stops stepping,
fails every watched request and reports the error (``/health`` answers 503). Shutdown
aborts what is still running and steps to idle first (the accounting stays exact).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from engine.engine import Engine, GenerateResult
from engine.request import SamplingParams

T = TypeVar("T")
Command = Callable[[Engine], Any]
REAP_PERIOD_S = 0.5  # how often an idle loop wakes to reap sessions (SGLang: once a second)
STALL_BACKOFF_S = 0.05  # a scheduler that cannot run anything waits this long for a command


class Progress(NamedTuple):
    """A streaming request's output so far."""

    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_tokens: int
    cached_tokens: int


class Failure(NamedTuple):
    """The loop could not finish the request (engine error, shutdown)."""

    message: str


Event = Progress | GenerateResult | Failure


@dataclass(slots=True, eq=False)
class Watch:
    """Where a request's events go: an asyncio queue on the server's event loop."""

    aloop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    stream: bool = False
    sent: int = 0

    def send(self, event: Event) -> None:
        self.aloop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass(frozen=True, slots=True)
class Submission:
    """One generate call, as the engine takes it."""

    input_ids: list[int]
    sampling_params: SamplingParams
    rid: str | None = None
    session_params: dict[str, Any] | None = None
    session_id: str | None = None  # top-level (#29436): a tag, or an open session's id
    return_logprob: bool = False
    logprob_start_len: int = -1


class EngineLoop:
    """Owns the engine thread; ``call``/``post`` run commands on it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.fatal: str | None = None
        self.watched: dict[str, Watch] = {}
        self._commands: queue.SimpleQueue[tuple[Command, concurrent.futures.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name="kvspec-engine-loop", daemon=True)
        self._stalls = 0

    # ---- the server's side ----

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread after the commands already queued; fail what is still watched."""
        if self._thread.is_alive():
            self._commands.put(None)
            self._thread.join(timeout)

    def submit(self, command: Callable[[Engine], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._commands.put((command, future))
        return future

    async def call(self, command: Callable[[Engine], T]) -> T:
        """Run ``command(engine)`` on the loop thread and await its value (or exception)."""
        return await asyncio.wrap_future(self.submit(command))

    def post(self, command: Command) -> None:
        """Fire and forget (an abort after a client went away)."""
        self.submit(command)

    def start_request(self, submission: Submission, watch: Watch) -> Command:
        """The command that submits a request: returns its rid and, when the engine finished
        it at once (a rejection, a prompt too long), its result; otherwise ``watch`` gets its
        events."""

        def command(engine: Engine) -> tuple[str, GenerateResult | None]:
            s = submission
            rid = engine.submit(
                s.input_ids,
                s.sampling_params,
                s.rid,
                session_params=s.session_params,
                session_id=s.session_id,
                return_logprob=s.return_logprob,
                logprob_start_len=s.logprob_start_len,
            )
            if rid in engine.results:
                return rid, engine.pop_result(rid)
            self.watched[rid] = watch
            return rid, None

        return command

    def stream_blocking(self, submission: Submission) -> Command:
        """The command that says whether ``submission`` is a turn of a streaming session
        whose live request is still being streamed to a client (which may just have gone
        away: its abort is on the way)."""

        def command(engine: Engine) -> bool:
            sid = (submission.session_params or {}).get("id", submission.session_id)
            session = engine.sessions.sessions.get(sid) if sid is not None else None
            if session is None or not session.streaming or session.inflight_rid is None:
                return False
            watch = self.watched.get(session.inflight_rid)
            return watch is not None and watch.stream

        return command

    def abort(self, rid: str, abort_all: bool = False) -> Command:
        """The command that aborts one watched request, or all of them; returns how many."""

        def command(engine: Engine) -> int:
            targets = list(self.watched) if abort_all else [rid] if rid in self.watched else []
            return sum(engine.abort(r) for r in targets)

        return command

    # ---- the thread ----

    def _run(self) -> None:
        busy = False
        while True:
            if not self._serve_commands(self._wait_s(busy)):
                break
            if self.fatal is None:
                busy = self._step()
            self._publish()
            time.sleep(0)  # let the HTTP thread take the GIL between steps (aborts land sooner)
        self._drain()
        self._fail_all("server shutting down")

    def _wait_s(self, busy: bool) -> float | None:
        """How long to wait for a command: 0 while working, a short back-off while stalled,
        the reap period while sessions wait to be reaped, else until one arrives."""
        if busy:
            return STALL_BACKOFF_S if self._stalls >= 2 else 0.0
        sessions = self.engine.sessions.sessions.values()
        return (
            REAP_PERIOD_S
            if any(s.timeout is not None or s.close_on_finish for s in sessions)
            else None
        )

    def _serve_commands(self, wait_s: float | None) -> bool:
        """Run the queued commands (waiting up to ``wait_s`` for the first); False on stop."""
        try:
            item = (
                self._commands.get(timeout=wait_s) if wait_s != 0.0 else self._commands.get_nowait()
            )
        except queue.Empty:
            return True
        while item is not None:
            command, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(command(self.engine))
                except Exception as exc:
                    future.set_exception(exc)
            self._publish()
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return True
        return False

    def _step(self) -> bool:
        """One engine step; whether there is more work. An engine exception is fatal."""
        try:
            outcome = self.engine.step()
        except Exception as exc:
            self.fatal = f"engine loop stopped: {type(exc).__name__}: {exc}"
            self._fail_all(self.fatal)
            return False
        self._stalls = 0 if outcome.progressed or outcome.idle else self._stalls + 1
        return not outcome.idle or bool(self.watched)

    def _drain(self, max_steps: int = 100_000) -> None:
        """Shutdown: abort every request still in the engine and step until idle, so each
        watcher gets its (aborted) result and the accounting is exact when the thread ends."""
        if self.fatal is not None:
            return
        for rid in list(self.engine.requests):
            self.engine.abort(rid)
        for _ in range(max_steps):
            if self.engine.is_idle() or not self._step():
                break
        self._publish()

    def _publish(self) -> None:
        """Hand each watched request its final result, or a streaming one its new tokens."""
        engine = self.engine
        for rid, watch in list(self.watched.items()):
            if rid in engine.results:
                del self.watched[rid]
                watch.send(engine.pop_result(rid))
                continue
            req = engine.requests.get(rid)
            if not watch.stream or req is None:
                continue
            n = len(req.output_ids) if req.finished_len is None else req.finished_len
            n = min(n, req.sampling_params.max_new_tokens)
            if n > watch.sent:
                watch.sent = n
                watch.send(
                    Progress(
                        tuple(req.output_ids[:n]),
                        tuple(req.output_token_logprobs[:n]),
                        len(req.origin_input_ids),
                        req.cached_tokens,
                    )
                )

    def _fail_all(self, message: str) -> None:
        for watch in self.watched.values():
            watch.send(Failure(message))
        self.watched.clear()
