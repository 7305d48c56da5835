"""Load over HTTP: many concurrent sessions (streaming and not), each turn at random a plain
request, a fully read stream, a stream the client abandons mid-way (disconnect), or a
stream aborted through /abort_request. Each successful streaming turn's prompt is the last
successful turn's tokens plus its own (aborted turns contribute nothing), and afterwards
every session is closed and idle accounting is exact with zero violations."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace
from typing import Any

import httpx
import pytest
from server_harness import BASE_ARGS, assert_clean_idle, encode, live_server

BUSY = "Streaming session already has an active request."  # an abort not yet processed: retry
# a long context, so a cut turn (100000 new tokens asked) is still running when its abort lands
LOAD_ARGS = replace(BASE_ARGS, context_length=16384, max_total_tokens=65536)


async def _stream(
    client: httpx.AsyncClient, body: dict[str, Any], stop_after: int | None
) -> dict[str, Any] | None:
    """Read a stream: to its end (returns the last meta_info), or — ``stop_after`` tokens in —
    abandon it (disconnect; returns None) or abort it by rid (stop_after < 0)."""
    last = None
    async with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            return {"status": response.status_code, "error": json.loads(await response.aread())}
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            last = json.loads(line[6:])["meta_info"]
            if (
                stop_after is not None
                and last["completion_tokens"] >= abs(stop_after)
                and last["finish_reason"] is None
            ):
                if stop_after > 0:
                    return None  # leaving the block closes the connection mid-stream
                await client.post("/abort_request", json={"rid": body["rid"]})
                stop_after = None
    return last


async def _turn(
    client: httpx.AsyncClient, body: dict[str, Any], mode: str
) -> dict[str, Any] | None:
    """One turn in ``mode``; retried while the previous turn's abort is still in flight."""
    for _ in range(200):
        if mode == "plain":
            r = await client.post("/generate", json=body)
            result = (
                r.json()["meta_info"]
                if r.status_code == 200
                else {"status": r.status_code, "error": r.json()}
            )
        else:
            result = await _stream(
                client, body, {"stream": None, "disconnect": 2, "abort": -2}[mode]
            )
        if result is None or result.get("error", {}).get("error", {}).get("message") != BUSY:
            return result
        await asyncio.sleep(0.01)
    raise AssertionError(f"session stayed busy: {body}")


async def _session(client: httpx.AsyncClient, index: int, turns: int, rng: random.Random) -> int:
    """One session's turns; returns how many were cut (disconnect or abort)."""
    streaming = index % 4 != 3
    r = await client.post(
        "/open_session", json={"capacity_of_str_len": 1000, "streaming": streaming}
    )
    sid, total, last_ok, cut = r.json(), 0, None, 0
    for t in range(turns):
        mode = rng.choices(["plain", "stream", "disconnect", "abort"], [5, 2, 1, 1])[0]
        text = f"S{index} T{t} " + "x" * rng.randint(0, 24)
        body = {
            "text": text,
            "rid": f"s{index}-t{t}",
            "session_params": {"id": sid, "rid": last_ok},
            "sampling_params": {
                "max_new_tokens": 100000 if mode in ("disconnect", "abort") else rng.randint(1, 12)
            },
        }
        meta = await _turn(client, body, mode)
        assert meta is None or "finish_reason" in meta, (index, t, mode, meta)
        if meta is None or meta["finish_reason"]["type"] == "abort":
            cut += 1
            continue
        expected = (
            total + len(encode(text)) - (1 if total else 0)
        )  # the BOS is stripped when appending
        assert meta["prompt_tokens"] == expected, (index, t, mode, meta)
        total, last_ok = meta["prompt_tokens"] + meta["completion_tokens"], meta["id"]
    assert (await client.post("/close_session", json={"session_id": sid})).status_code == 200
    return cut


async def _load(url: str, sessions: int, turns: int, seed: int) -> int:
    async with httpx.AsyncClient(
        base_url=url, timeout=120, limits=httpx.Limits(max_connections=2 * sessions)
    ) as client:
        cuts = await asyncio.gather(
            *(_session(client, i, turns, random.Random(seed * 1000 + i)) for i in range(sessions))
        )
    return sum(cuts)


def _run_load(sessions: int, turns: int, seed: int = 0) -> None:
    with live_server(LOAD_ARGS) as (_, client):
        cuts = asyncio.run(_load(client.base_url.__str__().rstrip("/"), sessions, turns, seed))
        report = assert_clean_idle(client)
        stats = report["engine"]["stats"]
        assert cuts > 0 and stats["aborted_reqs"] >= cuts, (cuts, stats)
        assert stats["finished_reqs"] >= sessions * turns


def test_concurrent_sessions_with_aborts_and_disconnects() -> None:
    """32 sessions × 10 turns (24 streaming, 8 not) with random disconnects and aborts:
    every turn's prompt is exact, and afterwards idle accounting is exact (seed 0)."""
    _run_load(32, 10)


@pytest.mark.slow
def test_concurrent_sessions_soak() -> None:
    """The same load, 64 sessions × 30 turns, seed 1."""
    _run_load(64, 30, seed=1)
