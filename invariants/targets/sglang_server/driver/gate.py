"""The server target's end inside SGLang's scheduler process: the release's adapter shims the
Scheduler SGLang is about to build (the fake worker, its pools — as on the sglang-scheduler
target), and once the driver says ``hold``, each iteration's receive waits for the driver.

Keeps: SGLang's own receive still takes every input off its own socket — the gate only decides
*when* an iteration may begin. Between two steps it polls that receive on the driver's
request, keeping what arrived for the next iteration, so the inputs a trace sends between two
steps land in one receive, every time (deterministic, not luck). Outputs still go to SGLang's
sockets; they are also recorded (which requests finished, how). A step's answer is the
sglang-scheduler target's (seams.py: the views, SGLang's own checks, the batch). An exception
in SGLang's loop is sent as the crash answer, then re-raised: SGLang's own handling goes on
(the launcher is told, the server goes down). Runs in the sglang venv; imports nothing of
kvspec.

Control protocol (JSON lines over the driver's Unix socket): first this side's banner (the
sglang-scheduler driver's, or a drift), then ``hold``; then per op one answer —
``poll`` {seconds} -> the keys of every input received since the last step;
``step`` -> that iteration's answer; ``idle``, ``unfinished``, ``stats``, ``advance_clock``,
``pick`` {phase, pick} -> as the sglang-scheduler driver answers them.
"""

from __future__ import annotations

import os
import time

import answers
import seams
import torch
from context_tokens import ContextTokens
from control import Control
from reader import trace_rid

FREE_WAIT = 0.005  # seconds an un-held idle iteration waits for the driver's hold


def key(request) -> list[str]:
    """What the driver waits for: an input's kind and its rid or session id."""
    kind = type(request).__name__
    if hasattr(request, "rid") and isinstance(request.rid, str):
        return [kind, trace_rid(request)]
    return [kind, str(getattr(request, "session_id", "") or "")]


class Gate:
    """One held Scheduler (see the module docstring)."""

    def __init__(self, scheduler, adapter, control: Control) -> None:
        self.scheduler, self.control = scheduler, control
        self.real_recv = adapter.real_receiver(scheduler)
        self.inputs = seams.Inputs(scheduler, adapter)
        tap_outputs(adapter.output_channels(scheduler), self.inputs.record)
        adapter.set_receiver(scheduler, self.boundary)
        self.held, self.stepping, self.iterations = False, False, 0
        self.arrived: list = []  # received since the last step, for the next one
        self.keys: list[list[str]] = []

    def boundary(self, local_reqs=None) -> list:
        """SGLang's receive, called at the top of every iteration."""
        if not self.held:
            got = self.real_recv(local_reqs)
            if self.control.waiting(0 if got else FREE_WAIT):
                self.held = self.control.read() == {"op": "hold"}
                self.control.say(views=[], result="held")
            return got
        if self.stepping:
            self.stepping, self.iterations = False, self.iterations + 1
            self.control.say(**self.inputs.step_answer(self.iterations))
        while (op := self.control.read()) is not None:
            if op["op"] == "step":
                self.stepping = True
                self.inputs.clock += seams.TICK
                taken, self.arrived, self.keys = self.arrived, [], []
                return list(local_reqs or []) + taken
            try:
                self.control.say(**self.answer(op))
            except (KeyError, ValueError) as exc:
                self.control.say(error=f"{type(exc).__name__}: {exc}")
        os._exit(0)  # the driver is gone: nothing of this server outlives its trace

    def answer(self, op: dict) -> dict:
        kind = op["op"]
        if kind == "poll":
            self.poll(float(op.get("seconds", 0.02)))
            return dict(views=[], result=self.keys)
        if kind == "pick":
            return dict(views=[], result=self.inputs.pick(op["phase"], int(op["pick"])))
        if kind == "advance_clock":
            self.inputs.clock += float(op["seconds"])
            return dict(views=[], result=None)
        if kind == "idle" and self.arrived:
            return dict(views=[], result=False)
        views, result = self.inputs.query(kind, op, self.iterations)
        return dict(views=views, result=result)

    def poll(self, seconds: float) -> None:
        """Receive until something arrives or ``seconds`` pass; keep it for the next step."""
        end = time.monotonic() + seconds
        while True:
            got = self.real_recv(None)
            for request in got:
                self.note(request)
            if got or time.monotonic() >= end:
                return
            time.sleep(0.001)

    def note(self, request) -> None:
        self.arrived.append(request)
        self.keys.append(key(request))
        kind = type(request).__name__
        if kind == "TokenizedGenerateReqInput":
            self.inputs.submitted.add(trace_rid(request))
        elif kind in ("OpenSessionReqInput", "CloseSessionReqInput"):
            self.inputs.session_ops += 1


def tap_outputs(channels, record) -> None:
    """Each output SGLang sends is recorded, then sent as SGLang sent it."""
    for channel in channels:
        real = channel.send_output

        def send(out, *args, _real=real, **kwargs):
            record(out)
            return _real(out, *args, **kwargs)

        channel.send_output = send


def install(scheduler_cls, adapter, cfg: dict, control: Control) -> None:
    """The context-token worker after the adapter's, and the gate around SGLang's loop."""
    install_worker(scheduler_cls, cfg)
    run_loop = scheduler_cls.run_event_loop

    def run_event_loop(scheduler) -> None:
        Gate(scheduler, adapter, control)
        try:
            run_loop(scheduler)
        except Exception as exc:
            control.say(**dict(answers.failure(exc, OURS, "sglang"), ended=True))
            raise

    scheduler_cls.run_event_loop = run_event_loop


def install_worker(scheduler_cls, cfg: dict) -> None:
    """The context-token worker (context_tokens.py) over the adapter's fake worker."""
    make_worker = scheduler_cls.init_tp_model_worker

    def init_tp_model_worker(scheduler) -> None:
        make_worker(scheduler)
        worker = scheduler.tp_worker
        allocator = worker.model_runner.token_to_kv_pool_allocator  # slots < size + a page
        ContextTokens(
            worker, torch.zeros(allocator.size + allocator.page_size, dtype=torch.int64), cfg
        )
        server_figures(scheduler, worker)

    scheduler_cls.init_tp_model_worker = init_tp_model_worker


def server_figures(scheduler, worker) -> None:
    """What ModelRunner and init_memory_pools would have set and the server's info routes
    read (``/server_info`` rounds them: a None ends the scheduler)."""
    worker.model_runner.weight_load_mem_usage = 0.0
    worker.get_decode_cuda_graph_bs = lambda: []  # no CUDA graphs on CPU
    if getattr(scheduler, "startup_available_gpu_memory_gb", None) is None:
        scheduler.startup_available_gpu_memory_gb = 0.0


OURS: tuple[str, ...] = ()  # the driver folders (set by the plugin: a crash's site is SGLang's)
