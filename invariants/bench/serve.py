"""`kvspec bench serve`: sessions × turns over real HTTP on loopback against `kvspec serve`'s
app (uvicorn in a thread, the checker at the server's strict level), with disconnects and
aborts; turns/s and per-turn latency percentiles, per session mode.

Modes: ``pinned`` — streaming sessions, each turn appends to the session's pinned slot (SGLang
``--enable-streaming-session``); ``radix`` — no session: each turn resends the whole history
as a plain request and reuses what the radix cache still holds; ``session-radix`` — the same
turns with a top-level ``session_id`` on a server with ``--enable-session-radix-cache``: the
session's KV is tagged, stays ordinary evictable radix KV and goes after untagged KV
(#27058/#29173). Each turn at random: read to the end (most),
dropped by the client after a few tokens (disconnect), or aborted by rid. Afterwards every
session is closed, the engine must reach idle with zero violations and balanced pools: a
benchmark that breaks the accounting reports that, not a number.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from dataclasses import replace
from typing import Any

import httpx
import numpy as np
import uvicorn

from engine.model.tokenizer import BOS_ID
from engine.server.args import ServerArgs
from invariants.machine import machine_info

MODES = ("pinned", "radix", "session-radix")
CUT_AFTER = 3  # tokens a dropped or aborted turn streams first


class Served:
    """`kvspec serve`'s app on a free loopback port, in a thread."""

    def __init__(self, args: ServerArgs) -> None:
        from invariants.checked_server import serve_app

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.app = serve_app(args)
        config = uvicorn.Config(self.app, log_level="warning", timeout_keep_alive=120)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> Served:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


async def _turn(
    client: httpx.AsyncClient, body: dict[str, Any], cut: str | None
) -> tuple[float, list[int] | None]:
    """One streamed turn: its latency and output ids (None: dropped, aborted or refused)."""
    began, last = time.perf_counter(), None
    async with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            await response.aread()
            return time.perf_counter() - began, None
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            last = json.loads(line[6:])
            done = last["meta_info"]["finish_reason"] is not None
            if cut is not None and not done and last["meta_info"]["completion_tokens"] >= CUT_AFTER:
                if cut == "abort":
                    await client.post("/abort_request", json={"rid": body["rid"]})
                    continue
                break  # the client goes away: a disconnect
    reason = None if last is None else last["meta_info"]["finish_reason"]
    ok = cut is None and reason is not None and reason["type"] != "abort"
    return time.perf_counter() - began, last["output_ids"] if ok and last else None


async def _session(
    client: httpx.AsyncClient, index: int, turns: int, mode: str, rng: random.Random
) -> list[float]:
    """One client: ``turns`` turns; the latencies of its successful ones."""
    sid = None
    if mode == "pinned":
        opened = await client.post(
            "/open_session", json={"capacity_of_str_len": 1 << 20, "streaming": True}
        )
        sid = opened.json()
    history: list[int] = [BOS_ID]
    latencies = []
    for t in range(turns):
        new = [rng.randrange(256) for _ in range(rng.randint(20, 120))]
        cut = rng.choices([None, "disconnect", "abort"], weights=[8, 1, 1])[0]
        body: dict[str, Any] = {
            "rid": f"b{index}-{t}",
            "input_ids": new if sid is not None else history + new,
            "sampling_params": {"max_new_tokens": rng.randint(16, 64)},
        }
        if sid is not None:
            body["session_params"] = {"id": sid}
        elif mode == "session-radix":
            body["session_id"] = f"b{index}"  # tags the history's KV; no open needed
        latency, output = await _turn(client, body, cut)
        if output is not None:
            latencies.append(latency)
            history += new + output
    if sid is not None or mode == "session-radix":
        await client.post("/close_session", json={"session_id": sid or f"b{index}"})
    return latencies


async def _load(url: str, sessions: int, turns: int, mode: str, seed: int) -> list[float]:
    limits = httpx.Limits(max_connections=sessions + 8, max_keepalive_connections=sessions + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        tasks = [
            _session(client, i, turns, mode, random.Random(seed * 7919 + i))
            for i in range(sessions)
        ]
        return [lat for per in await asyncio.gather(*tasks) for lat in per]


def _settled(url: str, timeout: float = 60.0) -> dict[str, Any]:
    """The /invariants report once idle; what the run left is part of the result."""
    deadline = time.monotonic() + timeout
    while True:
        report = httpx.get(f"{url}/invariants", timeout=30).json()
        if report["engine"]["idle"] and report["engine"]["num_requests"] == 0:
            return report
        if time.monotonic() > deadline:
            return report
        time.sleep(0.05)


def bench_mode(args: ServerArgs, sessions: int, turns: int, mode: str, seed: int) -> dict[str, Any]:
    """One mode's run: throughput, latency percentiles, and the accounting afterwards."""
    streaming = replace(
        args,
        enable_streaming_session=mode == "pinned",
        enable_session_radix_cache=mode == "session-radix",
    )
    with Served(streaming) as served:
        began = time.perf_counter()
        latencies = asyncio.run(_load(served.url, sessions, turns, mode, seed))
        wall = time.perf_counter() - began
        report = _settled(served.url)
    engine = report["engine"]
    lat = np.asarray(latencies) * 1000 if latencies else np.zeros(1)
    return {
        "mode": mode,
        "sessions": sessions,
        "turns": turns,
        "ok_turns": len(latencies),
        "wall_s": round(wall, 2),
        "turns_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 1),
        "p99_ms": round(float(np.percentile(lat, 99)), 1),
        "slots_reclaimed": engine["stats"].get("wedge_reclaims", 0),
        "cached_tokens": engine["stats"]["cached_tokens"],
        "violations": report["checker"].get("num_violations", 0),
        "balanced": all(p["balanced"] and p["request_owned"] == 0 for p in engine["pools"]),
        "idle": engine["idle"],
    }


def bench_serve(
    args: ServerArgs, sessions: int, turns: int, modes: list[str], seed: int
) -> dict[str, Any]:
    rows = [bench_mode(args, sessions, turns, mode, seed) for mode in modes]
    return {"machine": machine_info(), "server_args": args.public(), "rows": rows}
