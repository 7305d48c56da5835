"""Bad input over HTTP: each malformed or refused request gets HTTP 400 with
``{"error": {"message": …}}`` naming the problem (SGLang's shape and, where SGLang has one,
its message), the engine keeps running and its accounting stays exact. Schemathesis then
throws generated requests at every operation of the live OpenAPI schema: no 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from server_harness import (
    LiveServer,
    assert_clean_idle,
    close_session,
    encode,
    generate,
    hold_request,
    live_server,
    open_session,
)

OK_SAMPLING = {"max_new_tokens": 4}
# (case id, path, JSON body, substring of the error message)
SCHEMA_CASES: list[tuple[str, str, Any, str]] = [
    ("no-prompt", "/generate", {"sampling_params": OK_SAMPLING}, "Either text or input_ids"),
    ("two-prompts", "/generate", {"text": "a", "input_ids": [1, 2]}, "Either text or input_ids"),
    ("empty-ids", "/generate", {"input_ids": []}, "input_ids"),
    ("id-outside-vocab", "/generate", {"input_ids": [1, 300]}, "outside the vocabulary"),
    (
        "negative-max-new",
        "/generate",
        {"text": "a", "sampling_params": {"max_new_tokens": -1}},
        "max_new_tokens",
    ),
    ("unknown-sampling-key", "/generate", {"text": "a", "sampling_params": {"bogus": 1}}, "bogus"),
    (
        "bad-temperature",
        "/generate",
        {"text": "a", "sampling_params": {"temperature": "hot"}},
        "temperature",
    ),
    (
        "n-streamed",
        "/generate",
        {"text": "a", "stream": True, "sampling_params": {"n": 2}},
        "n > 1",
    ),
    ("n-too-many", "/generate", {"text": "a", "sampling_params": {"n": 65}}, "sampling_params.n"),
    ("unknown-key", "/generate", {"text": "a", "priority": 3}, "priority"),
    (
        "unknown-session-key",
        "/generate",
        {"text": "a", "session_params": {"id": "s", "streaming": True}},
        "streaming",
    ),
    ("batch-stream", "/generate", {"text": ["a", "b"], "stream": True}, "neither streamed"),
    ("batch-empty", "/generate", {"text": []}, "empty list"),
    ("lone-surrogate", "/generate", {"text": "\ud800x"}, "lone surrogate"),
    ("surrogate-rid", "/generate", {"text": "a", "rid": "\udfff"}, "rid: Value error, not valid"),
    (
        "regex",
        "/generate",
        {"text": "a", "sampling_params": {"regex": "[ab]+"}},
        "regex='[ab]+' is not supported",
    ),
    (
        "repetition-penalty",
        "/generate",
        {"text": "a", "sampling_params": {"repetition_penalty": 1.5}},
        "repetition_penalty=1.5 is not supported",
    ),
    (
        "min-new-over-max",
        "/generate",
        {"text": "a", "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 5}},
        "min_new_tokens must be in [0, max_new_tokens(4)], got 5",
    ),
    (
        "penalty-range",
        "/generate",
        {"text": "a", "sampling_params": {"presence_penalty": 2.5}},
        "presence_penalty",
    ),
    ("open-no-capacity", "/open_session", {"streaming": True}, "capacity_of_str_len"),
    ("open-bad-timeout", "/open_session", {"capacity_of_str_len": 1, "timeout": -1}, "timeout"),
    ("close-no-id", "/close_session", {}, "session_id"),
    ("abort-bad-flag", "/abort_request", {"abort_all": "maybe"}, "abort_all"),
]


@pytest.fixture(scope="module")
def shared_client() -> Iterator[httpx.Client]:
    """One server for the whole table (each case leaves it as it found it)."""
    with live_server() as (_, client):
        yield client


@pytest.mark.parametrize(
    ("path", "body", "needle"), [c[1:] for c in SCHEMA_CASES], ids=[c[0] for c in SCHEMA_CASES]
)
def test_schema_violations_answer_400(
    shared_client: httpx.Client, path: str, body: Any, needle: str
) -> None:
    """A body that breaks the schema answers 400 with a message naming the field (sent as
    ASCII JSON, so a lone surrogate travels as the escape a client would send)."""
    headers = {"content-type": "application/json"}
    r = shared_client.post(path, content=json.dumps(body), headers=headers)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_malformed_json_answers_400(shared_client: httpx.Client) -> None:
    """A body that is not JSON answers 400, not 422 or 500."""
    r = shared_client.post(
        "/generate", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def _reject(client: httpx.Client, body: dict[str, Any]) -> str:
    r = client.post("/generate", json=body)
    assert r.status_code == 400, r.text
    return r.json()["error"]["message"]


def test_engine_rejections_answer_400_and_the_engine_goes_on(
    server_client: tuple[LiveServer, httpx.Client],
) -> None:
    """Unknown and closed sessions, streaming-session rejections (replace, offset,
    drop_previous_output, a second turn in flight, a turn after a deferred close), a prompt
    over the context length, a logprob start past the prompt, a duplicate rid, a duplicate
    session id: each 400 with SGLang's message, also when the request asked to stream; then
    the session still works and idle accounting is exact."""
    server, client = server_client
    assert (
        _reject(client, {"text": "a", "session_params": {"id": "nope"}})
        == "Invalid request: session id nope does not exist"
    )
    sid = open_session(client)
    dup = client.post("/open_session", json={"capacity_of_str_len": 1, "session_id": sid})
    assert dup.status_code == 400 and "Failed to open the session" in dup.json()["error"]["message"]
    first = generate(client, encode("hello"), 4, sid).json()["meta_info"]
    for key, value, message in (
        ("replace", True, "Streaming sessions do not support replace."),
        ("offset", 2, "Streaming sessions do not support offset."),
        ("drop_previous_output", True, "Streaming sessions do not support drop_previous_output."),
    ):
        body = {"text": "x", "stream": True, "session_params": {"id": sid, key: value}}
        assert _reject(client, body) == message
    assert "maximum allowed length" in _reject(
        client, {"text": "y" * 3000, "session_params": {"id": sid}}
    )
    start = _reject(client, {"text": "abc", "return_logprob": True, "logprob_start_len": 50})
    assert start.startswith("logprob_start_len=50 is higher than the number of input tokens")
    body = {
        "text": "long",
        "stream": True,
        "rid": "busy-turn",
        "sampling_params": {"max_new_tokens": 100000},
        "session_params": {"id": sid},
    }
    with hold_request(server, "busy-turn"), client.stream("POST", "/generate", json=body) as stream:
        lines = stream.iter_lines()  # kept: dropping it closes the connection (= a disconnect)
        assert next(lines).startswith("data: ")
        assert (
            _reject(client, {"text": "x", "session_params": {"id": sid}})
            == "Streaming session already has an active request."
        )
        assert (
            _reject(client, {"text": "x", "rid": "busy-turn"}) == "duplicate request id 'busy-turn'"
        )
        close_session(client, sid)  # deferred: the turn is in flight
        assert (
            _reject(client, {"text": "x", "session_params": {"id": sid}})
            == f"Invalid request: close was requested for session {sid}"
        )
        assert client.post("/abort_request", json={"rid": "busy-turn"}).status_code == 200
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert first["finish_reason"]["type"] == "length"
    assert_clean_idle(client)
    assert (
        _reject(client, {"text": "x", "session_params": {"id": sid}})
        == f"Invalid request: session id {sid} does not exist"
    )


def _no_server_error(url: str, failures: list[str], statuses: list[int]) -> Any:
    """A Hypothesis test body: call the case, record its status and any 5xx."""

    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        response = case.call(base_url=url, timeout=30)
        statuses.append(response.status_code)
        if response.status_code >= 500:
            failures.append(
                f"{case.method} {case.path} -> {response.status_code}: {response.text[:200]}"
            )

    return check


def test_schemathesis_finds_no_server_error(server_client: tuple[LiveServer, httpx.Client]) -> None:
    """Generated requests for every operation of the live /openapi.json (bounded examples):
    none answers 5xx, and the server is still healthy afterwards."""
    import schemathesis

    server, client = server_client
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    failures: list[str] = []
    statuses: list[int] = []
    for operation in schema.get_all_operations():
        given(operation.ok().as_strategy())(_no_server_error(server.url, failures, statuses))()
    assert failures == []
    assert len(statuses) >= 100 and {200, 400} <= set(
        statuses
    )  # it reached both the engine and the validators
    client.post("/abort_request", json={"abort_all": True})
    client.post("/flush_cache")
    assert client.get("/health").status_code == 200
