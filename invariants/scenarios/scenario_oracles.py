"""Response oracles of scenario specs: what every response must say, given the trace that
produced it (SGLang's meta_info: prompt_tokens, completion_tokens, status).

Keeps: each oracle reads only the trace and the responses, never engine internals, so it is
an independent model of the API: ``lengths`` (a request that finished normally generated
``max_new_tokens``, clipped to the context, with ``ignore_eos``; a plain request's prompt is its
input), ``rejections`` (a request the workload marked ``!long``/``!param`` got HTTP 400, and no
other did), ``session_prompts`` (a session turn's prompt is its parent's tokens, cut at
``offset``, without output when ``drop_previous_output``, plus its input minus a leading BOS —
streaming: the parent is the last turn that finished without abort).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Literal

from engine.model.tokenizer import BOS_ID
from invariants.scenarios.ops import OpenSession, Submit, Trace
from invariants.scenarios.scenario import BAD_PARAM, TOO_LONG
from invariants.scenarios.trace_run import Response, TraceOutcome

MAX_REPORTED = 5


def check_oracles(
    names: Sequence[str], outcome: TraceOutcome, max_req_len: int, eos_prob: float
) -> list[str]:
    """One line per failed response (at most a few per oracle), prefixed by the oracle."""
    checks: dict[str, Callable[[], Iterator[str]]] = {
        "lengths": lambda: _lengths(outcome, max_req_len, eos_prob),
        "rejections": lambda: _rejections(outcome),
        "session_prompts": lambda: _session_prompts(outcome),
    }
    failures = []
    for name in names:
        found = list(checks[name]())
        failures += [f"oracle {name}: {line}" for line in found[:MAX_REPORTED]]
        if len(found) > MAX_REPORTED:
            failures.append(f"oracle {name}: … {len(found) - MAX_REPORTED} more")
    return failures


def _submits(trace: Trace) -> Iterator[tuple[int, Submit]]:
    for index, op in enumerate(trace.ops):
        if isinstance(op, Submit):
            yield index, op


def _lengths(outcome: TraceOutcome, max_req_len: int, eos_prob: float) -> Iterator[str]:
    for _, op in _submits(outcome.trace):
        r = outcome.responses.get(op.rid)
        if r is None or r.finish_type == "abort":
            continue
        if op.session is None and r.prompt_tokens != len(op.input_ids):
            yield f"{op.rid}: prompt_tokens={r.prompt_tokens}, sent {len(op.input_ids)}"
        want = min(op.max_new_tokens, max_req_len - r.prompt_tokens - 1)
        exact = op.ignore_eos or eos_prob == 0
        if r.completion_tokens > want or (
            exact and (r.completion_tokens, r.finish_type) != (want, "length")
        ):
            yield (
                f"{op.rid}: {r.finish_type} after {r.completion_tokens} tokens, "
                f"max_new_tokens {want}"
            )


def _rejections(outcome: TraceOutcome) -> Iterator[str]:
    for _, op in _submits(outcome.trace):
        r = outcome.responses.get(op.rid)
        if r is None:
            continue
        meant = TOO_LONG in op.rid or BAD_PARAM in op.rid
        if meant != (r.status_code == 400):
            expected = "400" if meant else "no 400"
            yield f"{op.rid}: status {r.status_code} ({r.message}), expected {expected}"


def _session_prompts(outcome: TraceOutcome) -> Iterator[str]:
    trace, responses = outcome.trace, outcome.responses
    streaming = {op.sid: op.streaming for op in trace.ops if isinstance(op, OpenSession)}
    last_ok: dict[str, Response] = {}  # streaming: the last turn that finished without abort
    for index, op in _submits(trace):
        r, ref = responses.get(op.rid), op.session
        if ref is None or ref.id not in streaming:
            continue
        if r is not None and r.status_code != 400:
            parent = (
                last_ok.get(ref.id)
                if streaming[ref.id]
                else _plain_parent(responses, ref.rid, index)
            )
            if parent is not False:
                want = _expected_prompt(op, parent)
                if r.prompt_tokens != want:
                    yield (
                        f"{op.rid}: prompt_tokens={r.prompt_tokens}, expected {want} "
                        f"(parent {parent.rid if parent else None})"
                    )
        if r is not None and r.finish_type != "abort" and streaming[ref.id]:
            last_ok[ref.id] = r


def _plain_parent(
    responses: dict[str, Response], rid: str | None, index: int
) -> Response | Literal[False] | None:
    """The parent's response; False when it is unknown (it had not finished when asked)."""
    if rid is None:
        return None
    parent = responses.get(rid)
    return parent if parent is not None and parent.op_index <= index else False


def _expected_prompt(op: Submit, parent: Response | None) -> int:
    ids = op.input_ids
    if parent is None:
        return len(ids)
    ref = op.session
    assert ref is not None
    prev = parent.prompt_tokens + (0 if ref.drop_previous_output else parent.completion_tokens)
    if ref.offset:
        prev = len(range(prev)[: ref.offset])
    return prev + len(ids) - (ids[0] == BOS_ID)
