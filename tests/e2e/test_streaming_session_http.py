"""SGLang's streaming-session HTTP suite (docs/sglang.md §4.1, every method) against a
real `kvspec serve` app over loopback, on a small matrix: page size 1/256 × overlap on/off ×
retract on/off, mixed chunk, EAGLE v1 and v2. Every server runs the whole catalog at
``--strict-mem-check 2`` — a violation makes ``/health`` 503 and refuses new work, so "the
server is healthy" is an oracle, as in SGLang — and each test ends with zero violations in
``/invariants`` and exact idle accounting (``assert_clean_idle``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from server_harness import (
    BASE_ARGS,
    BOS,
    LiveServer,
    assert_clean_idle,
    close_session,
    encode,
    generate,
    hold_request,
    live_server,
    meta,
    open_session,
)

PANGRAM = "The quick brown fox jumps over the lazy dog."
FILLER = " ".join(f"{PANGRAM} Sentence {i} of a long shared document." for i in range(100))
CHUNKS = (
    "Let me tell you something about France.",
    "The capital of France is",
    "The population of the city is",
)
# (id, flags) — SGLang's classes, scaled to the sim model
MATRIX: list[tuple[str, dict[str, Any]]] = [
    ("ps1-overlap", {"chunked_prefill_size": 64}),
    (
        "ps256-normal-retract",
        {
            "page_size": 256,
            "disable_overlap_schedule": True,
            "test_retract": True,
            "chunked_prefill_size": 512,
            "max_total_tokens": 256 * 160,
            "context_length": 4096,
        },
    ),
    (
        "ps1-overlap-retract-mixed",
        {"chunked_prefill_size": 128, "enable_mixed_chunk": True, "test_retract": True},
    ),
    ("eagle-v1-ps1", {"speculative_algorithm": "EAGLE", "chunked_prefill_size": 64}),
    (
        "eagle-v2-ps256-retract",
        {
            "speculative_algorithm": "EAGLE_V2",
            "page_size": 256,
            "test_retract": True,
            "chunked_prefill_size": 512,
            "max_total_tokens": 256 * 160,
            "context_length": 4096,
        },
    ),
]


SLOW_ROWS = {"eagle-v1-ps1"}  # beyond the matrix: make test-full only
PARAMS = [
    pytest.param(flags, id=name, marks=[pytest.mark.slow] if name in SLOW_ROWS else [])
    for name, flags in MATRIX
]


@pytest.fixture(scope="module", params=PARAMS)
def server(request: pytest.FixtureRequest) -> Iterator[tuple[LiveServer, httpx.Client]]:
    with live_server(replace(BASE_ARGS, **request.param)) as pair:
        yield pair


def _offset(srv: LiveServer) -> int:
    """SGLang's ``kv_inherit_offset``: with overlap the last token's KV is written (0)."""
    return 0 if srv.engine.config.enable_overlap else -1


def turn(
    client: httpx.Client,
    sid: str,
    text: str,
    max_new: int = 12,
    prev: str | None = None,
    **session: Any,
) -> dict[str, Any]:
    return meta(generate(client, encode(text), max_new, sid, prev, session=session))


def test_kv_cache_inheritance(server: tuple[LiveServer, httpx.Client]) -> None:
    """After /flush_cache, turn 1 caches nothing; turn k+1 inherits all of turn k:
    cached_tokens == prompt_k + completion_k + kv_inherit_offset; the BOS of later chunks
    is stripped from the prompt."""
    srv, client = server
    assert client.post("/flush_cache").status_code == 200
    sid = open_session(client)
    prev: str | None = None
    metas = []
    for text in CHUNKS:
        metas.append(turn(client, sid, text, 12, prev))
        prev = metas[-1]["id"]
    assert metas[0]["cached_tokens"] == 0
    for before, after, text in zip(metas, metas[1:], CHUNKS[1:]):
        assert after["cached_tokens"] == before["prompt_tokens"] + before[
            "completion_tokens"
        ] + _offset(srv)
        assert (
            after["prompt_tokens"]
            == before["prompt_tokens"] + before["completion_tokens"] + len(encode(text)) - 1
        )
    close_session(client, sid)
    assert_clean_idle(client)


async def _session_rounds(url: str, sessions: int, turns: int, logprob: dict[str, Any]) -> None:
    """``sessions`` streaming sessions; each turn's requests sent concurrently, rid-chained."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        opened = await asyncio.gather(
            *(
                client.post("/open_session", json={"capacity_of_str_len": 1000, "streaming": True})
                for _ in range(sessions)
            )
        )
        sids = [r.json() for r in opened]
        prev: list[str | None] = [None] * sessions
        for t in range(turns):
            bodies = [
                {
                    "text": f"S{s} T{t}: {PANGRAM}",
                    "sampling_params": {"max_new_tokens": 8},
                    "session_params": {"id": sid, "rid": prev[s]},
                    **logprob,
                }
                for s, sid in enumerate(sids)
            ]
            responses = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
            for s, r in enumerate(responses):
                assert r.status_code == 200, r.text
                body = r.json()["meta_info"]
                assert body["finish_reason"]["type"] == "length"
                assert ("output_token_logprobs" in body) == bool(logprob)
                prev[s] = body["id"]
        closed = await asyncio.gather(
            *(client.post("/close_session", json={"session_id": sid}) for sid in sids)
        )
        assert all(r.status_code == 200 for r in closed)


def test_leak_logprob_concurrent(server: tuple[LiveServer, httpx.Client]) -> None:
    """Six concurrent streaming sessions × three turns, opened and closed once per logprob
    mode (``return_logprob``; with ``logprob_start_len=0``; none), leave no leak: the server
    is healthy and idle accounting is exact."""
    srv, client = server
    for logprob in ({"return_logprob": True}, {"return_logprob": True, "logprob_start_len": 0}, {}):
        asyncio.run(_session_rounds(srv.url, 6, 3, logprob))
    assert_clean_idle(client)


async def _stress(url: str, big_pages: bool) -> None:
    size = 600 if big_pages else 160
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        sids = [
            (
                await client.post(
                    "/open_session", json={"capacity_of_str_len": 1000, "streaming": True}
                )
            ).json()
            for _ in range(8)
        ]
        for t in range(4):
            bodies = [
                {
                    "text": FILLER[(s * 7 + t) * 37 % 3000 :][:size],
                    "sampling_params": {"max_new_tokens": 16},
                    "session_params": {"id": sid},
                }
                for s, sid in enumerate(sids)
            ]
            bodies += [
                {"text": f"plain {t} {i}: {PANGRAM}", "sampling_params": {"max_new_tokens": 16}}
                for i in range(4)
            ]
            responses = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
            assert all(
                r.status_code == 200 and r.json()["meta_info"]["finish_reason"]["type"] == "length"
                for r in responses
            ), [r.text for r in responses if r.status_code != 200]
        for sid in sids:
            assert (
                await client.post("/close_session", json={"session_id": sid})
            ).status_code == 200
        for i in range(3):
            assert (
                await client.post("/generate", json={"text": f"cleanup {i}"})
            ).status_code == 200


def test_stress_concurrent_sessions(server: tuple[LiveServer, httpx.Client]) -> None:
    """Eight sessions × four turns of long prompts (chunked prefill) with four plain requests
    per turn, then close and plain cleanup requests: healthy, chunked, exact at idle."""
    srv, client = server
    asyncio.run(_stress(srv.url, srv.args.page_size >= 256))
    report = assert_clean_idle(client)
    assert report["engine"]["stats"]["chunked_prefills"] > 0


def _stream_then_abort(
    server: tuple[LiveServer, httpx.Client], sid: str, text: str
) -> dict[str, Any]:
    """A long streaming turn, held running after its third token; then POST /abort_request
    abort_all; the stream's final chunk (returned) must carry the abort."""
    srv, client = server
    body = {
        "text": text,
        "stream": True,
        "rid": "cut-turn",
        "sampling_params": {"max_new_tokens": 100000},
        "session_params": {"id": sid},
    }
    last: dict[str, Any] = {}
    with (
        hold_request(srv, "cut-turn", tokens=3),
        client.stream("POST", "/generate", json=body) as response,
    ):
        assert response.status_code == 200
        aborted = False
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            last = json.loads(line[len("data: ") :])
            if not aborted and last["meta_info"]["completion_tokens"] >= 3:
                assert (
                    client.post("/abort_request", json={"rid": "", "abort_all": True}).status_code
                    == 200
                )
                aborted = True
    return last["meta_info"]


def test_nth_mid_abort_recovery(server: tuple[LiveServer, httpx.Client]) -> None:
    """Turn 2 is aborted mid-decode (its response: finish_reason abort); turn 3's prompt is
    turn 1's tokens plus its own input — the aborted turn contributes nothing."""
    _, client = server
    sid = open_session(client)
    first = turn(client, sid, CHUNKS[0], 16)
    assert _stream_then_abort(server, sid, CHUNKS[1])["finish_reason"]["type"] == "abort"
    third = turn(client, sid, CHUNKS[2], 12)
    assert (
        third["prompt_tokens"]
        == first["prompt_tokens"] + first["completion_tokens"] + len(encode(CHUNKS[2])) - 1
    )
    close_session(client, sid)
    assert_clean_idle(client)


def test_first_mid_abort_recovery(server: tuple[LiveServer, httpx.Client]) -> None:
    """The very first turn is aborted mid-decode: turn 2 has no history (no BOS strip)."""
    _, client = server
    sid = open_session(client)
    assert _stream_then_abort(server, sid, CHUNKS[0])["finish_reason"]["type"] == "abort"
    second = turn(client, sid, CHUNKS[1], 12)
    assert second["prompt_tokens"] == len(encode(CHUNKS[1]))
    close_session(client, sid)
    assert_clean_idle(client)


def test_preabort_recovery(server: tuple[LiveServer, httpx.Client]) -> None:
    """Turn 2 with ``offset=1`` is rejected (HTTP 400, SGLang's message); the slot is intact,
    so turn 3 appends to turn 1 and inherits its KV."""
    srv, client = server
    sid = open_session(client)
    first = turn(client, sid, CHUNKS[0], 16)
    rejected = generate(client, encode(CHUNKS[1]), 12, sid, session={"offset": 1})
    assert rejected.status_code == 400
    assert rejected.json()["error"]["message"] == "Streaming sessions do not support offset."
    third = turn(client, sid, CHUNKS[2], 12)
    total = first["prompt_tokens"] + first["completion_tokens"]
    assert third["prompt_tokens"] == total + len(encode(CHUNKS[2])) - 1
    assert third["cached_tokens"] == total + _offset(srv)
    close_session(client, sid)
    assert_clean_idle(client)


def test_abort_heavy_chunked_prefill_does_not_leak() -> None:
    """SGLang's AbortLeakRepro: context 512, page 256, 32 running; four sessions through
    rounds of concurrent turns and plain requests, too-long turns (HTTP 400, "maximum
    allowed length"), and recovery turns that still inherit their slot's KV."""
    args = replace(
        BASE_ARGS,
        page_size=256,
        chunked_prefill_size=4096,
        context_length=512,
        max_total_tokens=256 * 64,
        max_running_requests=32,
    )
    with live_server(args) as (_, client):
        sids = [open_session(client) for _ in range(4)]
        for s, sid in enumerate(sids):
            assert (
                turn(client, sid, f"warm {s}: {PANGRAM[: 16 + s]}", 4)["finish_reason"]["type"]
                == "length"
            )
        for rnd in range(4):
            for sid in sids:
                long = generate(client, encode(FILLER[: 600 + rnd]), 4, sid)
                assert (
                    long.status_code == 400
                    and "maximum allowed length" in long.json()["error"]["message"]
                )
            for sid in sids:
                recovered = meta(generate(client, encode(f"recover {rnd}", bos=False), 4, sid))
                assert recovered["cached_tokens"] > 0
            assert client.get("/health").status_code == 200
        for sid in sids:
            close_session(client, sid)
        assert all(generate(client, encode(f"after {i}"), 4).status_code == 200 for i in range(3))
        assert_clean_idle(client)


def test_bos_only_turn_keeps_the_session(client: httpx.Client) -> None:
    """A turn whose input is only BOS appends nothing but still runs (SGLang strips the BOS
    when there is history): prompt = previous context."""
    sid = open_session(client)
    first = turn(client, sid, "abc", 3)
    again = meta(generate(client, [BOS], 3, sid))
    assert again["prompt_tokens"] == first["prompt_tokens"] + first["completion_tokens"]
    close_session(client, sid)
    assert_clean_idle(client)
