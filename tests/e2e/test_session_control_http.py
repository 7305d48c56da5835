"""SGLang's session-control HTTP suite (docs/sglang.md §4.4, test_session_control.py)
against the real server: non-streaming sessions with ``rid``/``offset``/``replace``,
backtracking and branching give the same tokens and logprobs as plain generation on the
concatenated context; every rejection is HTTP 400 with SGLang's message. Runs with streaming
sessions enabled and disabled (non-streaming sessions work with both); each test ends at
exact idle accounting with zero violations."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from server_harness import (
    BASE_ARGS,
    LiveServer,
    assert_clean_idle,
    close_session,
    encode,
    generate,
    live_server,
    meta,
    open_session,
)

CHUNKS = [
    "Let me tell you something about France.",
    "The capital of France is",
    "The population of the city is",
    "A brief history of the city:",
]


@pytest.fixture(
    scope="module", params=[True, False], ids=["streaming-enabled", "streaming-disabled"]
)
def server(request: pytest.FixtureRequest) -> Iterator[tuple[LiveServer, httpx.Client]]:
    with live_server(
        replace(BASE_ARGS, enable_streaming_session=request.param, page_size=4)
    ) as pair:
        yield pair


def _plain(client: httpx.Client, ids: list[int], max_new: int) -> dict[str, Any]:
    """The same context sent without a session (output ids and logprobs)."""
    body = generate(client, ids, max_new, return_logprob=True).json()
    return {
        "ids": body["output_ids"],
        "logprobs": [lp for lp, _, _ in body["meta_info"]["output_token_logprobs"]],
    }


def _logprobs(response: httpx.Response) -> list[float]:
    return [lp for lp, _, _ in meta(response)["output_token_logprobs"]]


def test_session_control_offset_replace_backtrack(server: tuple[LiveServer, httpx.Client]) -> None:
    """Each chunk is appended to the previous request with ``offset=-1, replace=True`` (its
    last output token dropped), with logprobs from ``len(context) - 1``; reopening the id, a
    logprob start past the prompt, a removed request id and a closed session are each
    rejected with 400; a backtrack to the first request answers as plain generation does."""
    _, client = server
    sid = open_session(client, streaming=False)
    again = client.post("/open_session", json={"capacity_of_str_len": 1000, "session_id": sid})
    assert (
        again.status_code == 400
        and "Failed to open the session" in again.json()["error"]["message"]
    )
    context: list[int] = []
    rids: list[str] = []
    for i, text in enumerate(CHUNKS):
        ids, max_new = encode(text), 1 if i == 0 else 12
        context = (context[:-1] + ids[1:]) if context else ids
        session = {"offset": -1, "replace": True}
        prev = rids[-1] if rids else None
        too_long = generate(
            client,
            ids,
            max_new,
            sid,
            prev,
            session=session,
            return_logprob=True,
            logprob_start_len=len(context) + 50,
        )
        assert (
            too_long.status_code == 400
            and "logprob_start_len" in too_long.json()["error"]["message"]
        )
        res = generate(
            client,
            ids,
            max_new,
            sid,
            prev,
            session=session,
            return_logprob=True,
            logprob_start_len=len(context) - 1,
        )
        plain = _plain(client, context, max_new)
        assert (
            meta(res)["prompt_tokens"] == len(context) and res.json()["output_ids"] == plain["ids"]
        )
        assert _logprobs(res) == pytest.approx(plain["logprobs"], abs=1e-9)
        context += res.json()["output_ids"]
        rids.append(meta(res)["id"])
    back = generate(
        client, encode(CHUNKS[-1]), 12, sid, rids[0], session={"offset": -1, "replace": True}
    )
    head = encode(
        CHUNKS[0]
    )  # the first request's prompt (its one output token dropped by offset -1)
    assert (
        back.json()["output_ids"] == _plain(client, head + encode(CHUNKS[-1], bos=False), 12)["ids"]
    )
    gone = generate(client, encode("x"), 4, sid, rids[1])
    assert (
        gone.status_code == 400 and gone.json()["error"]["message"] == "Invalid request session id"
    )
    close_session(client, sid)
    closed = generate(client, encode("x"), 4, sid)
    assert closed.status_code == 400
    assert closed.json()["error"]["message"] == f"Invalid request: session id {sid} does not exist"
    assert_clean_idle(client)


def test_session_control_with_branching(server: tuple[LiveServer, httpx.Client]) -> None:
    """A root and two branches of two steps each (``offset 0, replace False``): every answer
    equals plain generation on the root + branch context."""
    _, client = server
    sid = open_session(client, streaming=False)
    root_ids = encode("Root: the history of a small town.")
    root = generate(client, root_ids, 8, sid)
    base = root_ids + root.json()["output_ids"]
    for b in range(2):
        prev, context = meta(root)["id"], list(base)
        for step in range(2):
            ids = encode(f" Branch {b} step {step}.")
            res = generate(client, ids, 8, sid, prev, session={"offset": 0, "replace": False})
            context += ids[1:]
            assert res.json()["output_ids"] == _plain(client, context, 8)["ids"]
            assert meta(res)["prompt_tokens"] == len(context)
            context += res.json()["output_ids"]
            prev = meta(res)["id"]
    close_session(client, sid)
    assert_clean_idle(client)


def test_streaming_needs_the_flag(server: tuple[LiveServer, httpx.Client]) -> None:
    """Opening a streaming session answers 400 with SGLang's message unless the server runs
    with --enable-streaming-session."""
    srv, client = server
    r = client.post("/open_session", json={"capacity_of_str_len": 10, "streaming": True})
    if srv.args.enable_streaming_session:
        assert r.status_code == 200
        close_session(client, r.json())
    else:
        assert r.status_code == 400
        assert r.json()["error"]["message"] == (
            "Streaming sessions are disabled. Please relaunch with --enable-streaming-session."
        )
    assert_clean_idle(client)
