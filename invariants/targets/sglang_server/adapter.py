"""The sglang-server target's adapter (the ``Adapter`` of targets/registry.py): SGLang's REAL
HTTP server — ``python -m sglang.launch_server``, its FastAPI app and TokenizerManager, its
Scheduler and DetokenizerManager processes — one release per venv (the sglang-scheduler
target's venvs), with only the model worker faked; the trace is sent as real HTTP calls
(driver/client.py) and the catalog checks every iteration inside the scheduler process
(driver/gate.py), plus each HTTP answer as a ``response`` view.

Keeps: a trace means what it means on the sglang-scheduler target — the same config op, the
same seeded engine draws, the same views — except that its inputs take SGLang's real request
path (validation, the tokenizer manager's session and abort handling) and its outputs come
back as HTTP answers; the fake worker's next token is a function of the KV it attends to
(driver/context_tokens.py), so every plain request's and streaming turn's answer is checked
against the uncached reference. What it does not drive yet — EOS-free speculative decoding,
hybrid SWA and MLA pools, the on-demand retract — is refused before a server starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.view import StateView
from invariants.explore.swarm import Swarm
from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import vllm_only_fields
from invariants.targets.drive import Drive
from invariants.targets.driver import LineDriver, TargetUnavailable
from invariants.targets.registry import TargetOptions
from invariants.targets.sglang_scheduler import adapter as scheduler
from invariants.targets.sglang_scheduler.releases import SchedulerDriver

SCRIPT = Path(__file__).resolve().parent / "driver" / "main.py"
UNSUPPORTED_OPS = {
    "force_retract": "force_retract: the server retracts through SGLang's own test hook "
    "(engine: test_retract, test_retract_interval), not on demand",
}


SENT = ("submit", "open_session", "close_session", "abort", "flush_cache", "advance_clock")


@dataclass
class Timeline:
    """What one trace did on the server, iteration by iteration: each op that sent something
    with the iteration it was sent after, the iteration each request finished in, and the
    crash answer (SGLang's traceback) if the scheduler died — what a reproducer replays."""

    iterations: int = 0
    sent: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    finished_at: dict[str, int] = field(default_factory=dict)
    crash: dict[str, Any] | None = None


class ServerDriver(SchedulerDriver):
    """The server driver under the release's interpreter; one server per trace (its launch
    ``command`` and its ``timeline`` kept per trace)."""

    NAME, SCRIPT = "sglang-server", SCRIPT

    def __init__(self, version: str | None = None, python: str | Path | None = None) -> None:
        self.command: list[str] = []
        self.timeline = Timeline()
        super().__init__(version, python)

    def refusal(self, answer: dict[str, Any], what: str) -> Exception:
        """A server that could not be started (a port in use, not ready in time, an import
        the venv lacks) is a set-up problem: ``TargetUnavailable``, exit 2."""
        if answer.get("unavailable"):
            return TargetUnavailable(f"sglang-server {self.version}: {answer['error']}")
        return super().refusal(answer, what)

    def answered(self, op: dict[str, Any], answer: dict[str, Any]) -> None:
        super().answered(op, answer)
        kind, line = op["op"], self.timeline
        if kind == "config" and "error" not in answer:
            self.command, self.timeline = answer["result"]["command"], Timeline()
        elif answer.get("crash"):
            line.crash = answer
        elif kind == "step" and "error" not in answer:
            line.iterations += 1
            for rid in (answer.get("batch") or {}).get("finished", ()):
                line.finished_at.setdefault(rid, line.iterations)
        elif kind in SENT and "error" not in answer:
            if kind == "abort" and answer["result"] is None:
                return  # the pick found no live request: nothing was sent
            picked = {"rid": answer["result"]} if kind == "abort" else {}
            line.sent.append((line.iterations, {**op, **picked}))


installed_releases = scheduler.installed_releases  # the scheduler target's venvs


def open_driver(options: TargetOptions) -> LineDriver:
    return ServerDriver(options.version, options.python)


def unsupported(trace: Trace, version: str | None = None) -> list[str]:
    """Why ``trace`` cannot run on the release's real server (empty: it can)."""
    engine = trace.engine
    checks = {
        "speculative (the server target drives no draft worker yet)": engine.speculative
        is not None,
        "swa_tokens (the server target builds no hybrid SWA pools yet)": engine.swa_tokens
        is not None,
        "tiny.attention=mla (the server target builds no MLA pools yet)": scheduler.is_mla(engine),
        "model: tiny (the target's forward is the fake worker)": engine.model != "sim",
    }
    ops = sorted({UNSUPPORTED_OPS[op.op] for op in trace.ops if op.op in UNSUPPORTED_OPS})
    vllm_only = [
        f"{name} (a vLLM feature: the vllm target only)" for name in vllm_only_fields(engine)
    ]
    return [name for name, on in checks.items() if on] + vllm_only + ops


def config(trace: Trace, fault: dict[str, Any] | None = None, observe: bool = True) -> dict:
    """The sglang-scheduler target's config op: the server's flags are made from it."""
    return scheduler.config(trace, fault, observe)


def decoder() -> Callable[[dict[str, Any]], StateView]:
    return scheduler.decoder()


def notes(trace: Trace, drive: Drive) -> tuple[str, ...]:
    return ()


DISCONNECT = 0.5  # the weight of a client hanging up (half an abort's)


def swarm(seed: int) -> Swarm:
    """The sglang-scheduler target's draws, plus clients that hang up mid-request (what only
    a real front end can show); a server per seed: explore with fewer seeds."""
    drawn = scheduler.swarm(seed)
    on = drawn.weights.get("abort", 0.0) > 0
    return replace(drawn, weights={**drawn.weights, "disconnect": DISCONNECT if on else 0.0})


def label(swarm: Swarm) -> str:
    return scheduler.label(swarm)
