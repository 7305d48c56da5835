"""Engine: the facade over memory, scheduler and model — submit/generate, step, abort,
flush, and the state view the checker reads (docs/design.md decision 1).

Keeps: every submitted request yields exactly one result (finished, stopped or aborted);
the engine is deterministic from ``EngineConfig.seed`` and the injected clock; observers see
the events of the hook protocol (engine/hooks.py) and nothing is built for them when none is
attached. The checking level is stored here (config, or ``KVSPEC_STRICT``); the harness
attaches the checker. A runner that verifies KV (``IntegritySource``: the sim model) is
drained at every ``forward`` event, so that event's view carries exactly the failed reads of
that forward (``StateView.integrity``); any other runner contributes none.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from engine.config import EngineConfig, resolve_strict_level
from engine.hooks import Clock, Observer, SimClock, make_hooks
from engine.memory import KVMemory
from engine.model.runner import ModelRunner
from engine.observe.state_view import StateViews
from engine.request import FinishReason, Req, SamplingParams
from engine.sched.decode import DecodePolicy, PlainDecode
from engine.sched.scheduler import Scheduler
from engine.sched.sessions import SessionController
from engine.sched.stats import SchedulerStats, StepOutcome
from engine.session_api import SessionAPI, SessionParamsLike
from engine.speculative.eagle import EagleWorker
from engine.view import (
    OPTIONAL_PARTS,
    IntegrityView,
    ResponseView,
    StateView,
)


@runtime_checkable
class IntegritySource(Protocol):
    """A runner that verifies the KV it reads (the sim model): it hands over, and forgets,
    the failed reads since the last call."""

    def take_integrity_failures(self) -> Iterable[Any]: ...


def integrity_taker(runner: object) -> Callable[[], Iterable[Any]]:
    """The runner's ``take_integrity_failures``, or a source of none for a runner without."""
    return runner.take_integrity_failures if isinstance(runner, IntegritySource) else tuple


class SchedulerStall(RuntimeError):
    """Requests wait, nothing runs, and nothing can be admitted (the pool is too small)."""


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """One finished request, as the API returns it."""

    rid: str
    output_ids: tuple[int, ...]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    output_token_logprobs: tuple[float, ...] = ()  # one per output token, with return_logprob
    # with return_logprob: prompt positions [logprob_start_len, prompt) and their logprobs
    input_token_ids: tuple[int, ...] = ()
    input_token_logprobs: tuple[float, ...] = ()

    def meta_info(self) -> dict[str, Any]:
        """SGLang's ``meta_info`` fields."""
        return {
            "id": self.rid,
            "finish_reason": self.finish_reason.to_json(),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
        }


class Engine(SessionAPI):
    """The reference engine. ``runner`` defaults to the sim model; ``clock`` to simulated time;
    sessions (streaming with ``enable_streaming_session``): engine/session_api.py."""

    def __init__(
        self,
        config: EngineConfig = EngineConfig(),
        *,
        runner: ModelRunner | None = None,
        clock: Clock | None = None,
        observers: Sequence[Observer] = (),
    ) -> None:
        self.config = config
        self.strict_level = resolve_strict_level(config)
        self.clock: Clock = clock if clock is not None else SimClock()
        self.sessions = SessionController(self.clock.now, config.enable_streaming_session)
        spec, streaming = config.speculative, config.enable_streaming_session
        self.mem = KVMemory.from_config(
            config.memory,
            row_reserve=0 if spec is None else spec.row_reserve,
            sessions=self.sessions if streaming else None,
        )
        self.runner: ModelRunner = (
            runner if runner is not None else default_runner(config, self.mem)
        )
        self.hooks = make_hooks(observers)
        policy = decode_policy(config, self.mem, self.runner)
        self.scheduler = Scheduler(config, self.mem, policy, self._emit)
        self._response = ResponseView()
        self._response_req: Req | None = None  # the request of the response being viewed
        self._take_integrity = integrity_taker(self.runner)
        self.integrity: tuple[IntegrityView, ...] = ()  # failed reads of this iteration's forward
        self.requests: dict[str, Req] = {}  # every request not yet popped by its caller
        self.results: dict[str, GenerateResult] = {}
        self._rids = itertools.count()
        self.views = StateViews(self.mem, self.scheduler, self.sessions, self.runner)

    # ---- observers ----

    def _emit(self, event: str) -> None:
        if event == "forward":  # taken at every forward, observed or not
            self.integrity = tuple(
                IntegrityView(f.rid, f.position, f.slot, f.pool, f.expected, f.found)
                for f in self._take_integrity()
            )
        self.hooks.on_event(event, self)
        if event == "step":
            self.integrity = ()

    def attach(self, observer: Observer) -> None:
        self.hooks = make_hooks([*self.hooks.observers, observer])

    def detach(self, observer: Observer) -> None:
        self.hooks = make_hooks([o for o in self.hooks.observers if o is not observer])

    # ---- requests ----

    def submit(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        rid: str | None = None,
        *,
        session_params: SessionParamsLike | None = None,
        session_id: str | None = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
    ) -> str:
        """Queue a request; returns its id. A prompt over the length limit finishes at once
        (abort, status 400) without touching memory; so does a session request the session
        rejects (``session_params``: SGLang's ``id, rid, offset, replace,
        drop_previous_output``). A top-level ``session_id`` (SGLang #29436) tags the
        request's KV for that session when the cache has session tags (no open needed);
        otherwise it names an open session, as ``session_params={"id": ...}`` does."""
        rid = rid if rid is not None else f"req-{next(self._rids)}"
        if rid in self.requests:
            raise ValueError(f"duplicate request id {rid!r}")
        if session_id is not None and session_params is not None:
            raise ValueError("session_id and session_params are mutually exclusive")
        if session_id is not None and self.mem.session_refs is None:
            session_params, session_id = {"id": session_id}, None
        req = self._new_req(rid, input_ids, sampling_params, session_params, session_id)
        self._check_logprob_start(req, return_logprob, logprob_start_len)
        self.requests[rid] = req
        self.scheduler.add_request(req)
        self._collect()
        return rid

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        session_params: SessionParamsLike | Sequence[SessionParamsLike] | None = None,
    ) -> list[GenerateResult]:
        """Submit every prompt, run until idle, return the results in prompt order."""
        per = params if isinstance(params, Sequence) else [params] * len(prompts)
        sess = (
            session_params
            if isinstance(session_params, Sequence)
            else [session_params] * len(prompts)
        )
        if len(per) != len(prompts) or len(sess) != len(prompts):
            raise ValueError(
                f"{len(prompts)} prompts but {len(per)} sampling / {len(sess)} session params"
            )
        rids = [self.submit(p, sp, session_params=ss) for p, sp, ss in zip(prompts, per, sess)]
        self.run_until_idle()
        return [self.pop_result(rid) for rid in rids]

    def pop_result(self, rid: str) -> GenerateResult:
        """The result of a finished request (then forgotten by the engine)."""
        result = self.results.pop(rid)
        self.requests.pop(rid, None)
        return result

    def abort(self, rid: str) -> bool:
        """Abort a waiting (finished at once) or running (finished after its next forward,
        released the normal way) request; False if it is unknown or already finished."""
        found = self.scheduler.abort(rid)
        self._collect()
        if self.sessions.sessions:
            self._emit("session")
        return found

    def flush_cache(self) -> bool:
        """Empty the prefix cache (and every session slot) and the pools; refused (False)
        unless fully idle."""
        flushed = self.scheduler.flush_cache()
        if flushed and self.sessions.sessions:
            self.sessions.on_flush()
            self._emit("session")
        return flushed

    # ---- running ----

    def step(self) -> StepOutcome:
        """Reap sessions (deferred closes, timeouts), one scheduler loop iteration, then one
        clock tick."""
        self._reap()
        outcome = self.scheduler.step()
        self.clock.tick()
        self._collect()
        return outcome

    def run_until_idle(self, max_steps: int | None = None) -> int:
        """Step until the scheduler declares idle; returns the number of steps. Raises
        ``SchedulerStall`` when requests wait but nothing can run."""
        steps, empty = 0, 0
        while max_steps is None or steps < max_steps:
            outcome = self.step()
            steps += 1
            if outcome.idle:
                return steps
            # one empty iteration is normal (finished requests are filtered only after the
            # prefill attempt); two in a row mean nothing can ever run
            empty = 0 if outcome.progressed else empty + 1
            if empty >= 2:
                raise SchedulerStall(self._stall_message())
        return steps

    def is_idle(self) -> bool:
        return self.scheduler.is_fully_idle()

    def _collect(self) -> None:
        finished, self.scheduler.finished_reqs = self.scheduler.finished_reqs, []
        for req in finished:
            assert req.finished_reason is not None
            n = req.finished_len if req.finished_len is not None else len(req.output_ids)
            self.results[req.rid] = GenerateResult(
                req.rid,
                tuple(req.output_ids[:n]),
                req.finished_reason,
                len(req.origin_input_ids),
                n,
                req.cached_tokens,
                tuple(req.output_token_logprobs[:n]),
                *_input_logprobs(req),
            )
            self._retired(req, len(req.origin_input_ids), n)

    def _stall_message(self) -> str:
        waiting = self.scheduler.waiting_queue
        head = waiting[0] if waiting else None
        what = (
            f"request {head.rid} ({len(head.origin_input_ids)} prompt tokens)"
            if head
            else "a request"
        )
        rows = self.mem.req_to_token_pool.available_size()
        if head is not None and head.req_pool_idx is None and rows == 0:
            return (
                f"scheduler stalled: {len(waiting)} waiting, nothing running; {what} finds no "
                f"free request row (max_num_reqs={self.config.memory.max_num_reqs}, every "
                "row held by a session slot or a waiting request)"
            )
        return (
            f"scheduler stalled: {len(waiting)} waiting, nothing running; {what} does not fit "
            f"{self.mem.admittable_size()} free+evictable tokens (max_total_tokens="
            f"{self.config.memory.max_total_tokens}, page_size={self.config.memory.page_size})"
        )

    # ---- introspection ----

    @property
    def stats(self) -> SchedulerStats:
        return replace(self.scheduler.stats)

    @property
    def step_count(self) -> int:
        return self.scheduler.stats.iterations

    def state_view(self, event: str = "step", parts: frozenset[str] = OPTIONAL_PARTS) -> StateView:
        """The plain-data snapshot of memory and scheduler that invariants read (built by
        engine/observe/): the live requests (waiting with a row, chunked, running, launched)
        with where each is held, this iteration's releases, and the failed KV reads of its
        forward. ``parts`` names the costly parts to build (``OPTIONAL_PARTS``: the census,
        the tree's nodes) and, with ``view.SELECTIVE``, the only sections to build."""
        return self.views.build(event, parts, self.integrity, self._response, self._response_req)


def decode_policy(config: EngineConfig, mem: KVMemory, runner: ModelRunner) -> DecodePolicy:
    """The scheduler's decode step: plain, or EAGLE v1 / v2 (``config.speculative``)."""
    if config.speculative is None:
        return PlainDecode(mem, runner)
    return EagleWorker.make(config, mem, runner)


def default_runner(config: EngineConfig, mem: KVMemory) -> ModelRunner:
    """The sim model over fingerprint arrays shaped like ``mem``'s pools; or, with
    ``model="tiny"``, the tiny transformer over KV buffers shaped like them."""
    if config.model == "tiny":
        from engine.model.tiny import TinyModel

        return TinyModel.for_memory(config.tiny, mem, config.seed)
    from engine.model.fingerprint import KVFingerprints
    from engine.model.sim import SimModel

    kv = KVFingerprints.for_allocator(
        mem.allocator, config.memory.sliding_window if config.memory.is_hybrid else None
    )
    return SimModel(config.seed, kv, config.eos_prob)


def _input_logprobs(req: Req) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The prompt tokens from ``logprob_start_len`` on and the logprobs taken for them."""
    if not req.return_logprob or req.finished_reason is None or req.logprob_start_len < 0:
        return (), ()
    ids = req.origin_input_ids[req.logprob_start_len :]
    return tuple(ids[: len(req.input_token_logprobs)]), tuple(req.input_token_logprobs)
