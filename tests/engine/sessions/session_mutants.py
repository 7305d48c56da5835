"""Mutant harness for the session regression tests: a checker that stops the engine after the
first event with violations and hands back all of that event's findings, and the scenarios
several regressions share.

Keeps: a scenario runs on a streaming-session engine with the whole shipped catalog (or the
rules given) at level 1; ``first_violations`` is empty exactly when the run was clean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from session_support import CATALOG, encode, session_config, sp, turn

from engine.engine import Engine
from invariants.checking.checker import Checker, CheckerHook, Level, Violation

Scenario = Callable[[Engine], None]
TEXTS = ("Let me tell you something about France.", "The capital of France is", "The population is")
RETRY = {
    "page_size": 4,
    "overlap": False,
    "max_prefill_tokens": 64,
}  # one round's prefill budget: one prompt


class Stop(Exception):
    """Raised by ``StopAtFirst`` with every violation of the first event that had any."""

    def __init__(self, found: tuple[Violation, ...]) -> None:
        super().__init__(", ".join(v.invariant for v in found))
        self.found = found


class StopAtFirst:
    """The catalog at level 1 at every event; stops the engine after the first event with
    violations (so all of that event's findings are seen, not only the first rule's)."""

    def __init__(self, rules: Any) -> None:
        self.hook = CheckerHook(Checker(rules, Level.RECORD))

    def on_event(self, event: str, engine: Any) -> None:
        self.hook.on_event(event, engine)
        if self.hook.checker.violations:
            raise Stop(tuple(self.hook.checker.violations))


def first_violations(
    scenario: Scenario, rules: Any = CATALOG, **config: Any
) -> dict[str, Violation]:
    """Run ``scenario`` on a checked streaming engine, then to idle; the violations of the
    first event that had any, by invariant id (empty: the run was clean)."""
    engine = Engine(session_config(**config), observers=[StopAtFirst(rules)])
    try:
        scenario(engine)
        engine.run_until_idle()
    except Stop as stop:
        return {v.invariant: v for v in stop.found}
    return {}


def _abort_mid_decode(engine: Engine, rid: str) -> None:
    while len(engine.requests[rid].output_ids) < 3:
        engine.step()
    engine.abort(rid)
    engine.run_until_idle()


def three_turns(engine: Engine) -> None:
    """Three turns of one session; turn 1 ends off a page boundary (40 + 9 tokens)."""
    sid = engine.open_session(1000, streaming=True)
    for text in TEXTS:
        turn(engine, sid, encode(text), 9)
    engine.close_session(sid)


def abort_second_turn(engine: Engine) -> None:
    sid = engine.open_session(1000, streaming=True)
    turn(engine, sid, encode(TEXTS[0]), 8)
    _abort_mid_decode(engine, engine.submit(encode(TEXTS[1]), sp(1000), session_params={"id": sid}))
    turn(engine, sid, encode(TEXTS[2]), 8)
    engine.close_session(sid)
