"""``kvspec serve --enable-session-radix-cache`` (SGLang #27058/#29173, top-level
``session_id`` #29436): sessions need no open, each turn is an ordinary radix request whose
KV its session tags, close drops the tags and leaves the KV cached and evictable — over real
HTTP, by the native API and OpenAI's client, checked by the whole catalog at level 2."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import httpx
import openai
import pytest
from server_harness import BASE_ARGS, LiveServer, assert_clean_idle, live_server

SYSTEM = "You are a checker of KV caches. Keep every answer short. " * 2


@pytest.fixture
def tagged() -> Iterator[tuple[LiveServer, httpx.Client]]:
    args = dataclasses.replace(BASE_ARGS, enable_session_radix_cache=True)
    with live_server(args) as pair:
        yield pair


def test_native_turns_tag_and_close_releases(tagged: tuple[LiveServer, httpx.Client]) -> None:
    """Two turns of one session by ``/generate`` with ``session_id`` and no open: the second
    sends the whole history and finds it cached; ``/metrics`` counts the tagging session
    until ``/close_session``; nothing is left request-owned or session-held."""
    _, client = tagged
    first = client.post(
        "/generate",
        json={
            "text": SYSTEM + "Q1?",
            "session_id": "chat",
            "sampling_params": {"max_new_tokens": 6},
        },
    )
    assert first.status_code == 200, first.text
    history = SYSTEM + "Q1?" + first.json()["text"] + " Q2?"
    second = client.post(
        "/generate",
        json={"text": history, "session_id": "chat", "sampling_params": {"max_new_tokens": 6}},
    )
    assert second.status_code == 200, second.text
    assert second.json()["meta_info"]["cached_tokens"] >= len(SYSTEM)
    assert "kvspec_tagged_sessions 1.0" in client.get("/metrics").text
    assert client.post("/close_session", json={"session_id": "chat"}).status_code == 200
    assert "kvspec_tagged_sessions 0.0" in client.get("/metrics").text
    report = assert_clean_idle(tagged[1])
    assert report["engine"]["tagged_sessions"] == []


def test_openai_chat_turns_share_a_session(tagged: tuple[LiveServer, httpx.Client]) -> None:
    """OpenAI chat turns carrying ``session_id`` in the body reuse the conversation's KV."""
    server, client = tagged
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Q1?"}]
    first = oai.chat.completions.create(
        model="kvspec-sim", messages=messages, max_tokens=6, extra_body={"session_id": "c"}
    )
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Q2?"},
    ]
    second = oai.chat.completions.create(
        model="kvspec-sim", messages=messages, max_tokens=6, extra_body={"session_id": "c"}
    )
    assert second.usage.prompt_tokens_details.cached_tokens >= len(SYSTEM)
    client.post("/close_session", json={"session_id": "c"})
    assert_clean_idle(client)
