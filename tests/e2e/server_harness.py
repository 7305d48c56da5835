"""The live server for the end-to-end tests (their fixtures: conftest.py): real uvicorn on a
free loopback port in a thread, built by the same function as `kvspec serve`
(invariants/checked_server.py ``serve_app``), and a real HTTP client (httpx).

Keeps: a server is up (``/health`` 200) before a test gets it and is shut down cleanly (the
engine loop joined) after; ``assert_clean_idle`` is the oracle every test ends with — the
engine reaches idle, no invariant violation was recorded, every pool balances (``free +
evictable + protected == capacity``, nothing session-held or request-owned) with an empty
census, and no session or slot is left.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx
import uvicorn

from engine.model.tokenizer import ByteTokenizer
from engine.server.args import ServerArgs
from invariants.checked_server import serve_app

TOKENIZER = ByteTokenizer()
BOS = TOKENIZER.bos_token_id
BASE_ARGS = ServerArgs(
    enable_streaming_session=True,
    max_total_tokens=16384,
    context_length=2048,
    chunked_prefill_size=64,
    strict_mem_check=2,
)


class LiveServer:
    """uvicorn serving ``serve_app(args)`` on 127.0.0.1 in a background thread."""

    def __init__(self, args: ServerArgs) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.args = replace(args, port=self.port)
        self.app = serve_app(self.args)
        # a long keep-alive: a pooled connection the server closes while the client reuses it
        # would surface as a spurious ReadError under load
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=120,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.started:
                try:
                    if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.02)
        raise RuntimeError(f"server on {self.url} did not become healthy in {timeout} s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()
        assert not self.thread.is_alive(), "uvicorn did not shut down"

    @property
    def engine(self) -> Any:
        """The engine (tests read it only through HTTP; this is for planting mutants)."""
        return self.app.state.server.loop.engine


@contextmanager
def live_server(args: ServerArgs = BASE_ARGS) -> Iterator[tuple[LiveServer, httpx.Client]]:
    server = LiveServer(args)
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            yield server, client
    finally:
        server.stop()


HOLD_POLL_S = 0.005  # a held loop's pause between command checks


@contextmanager
def hold_request(server: LiveServer, rid: str, tokens: int = 1) -> Iterator[None]:
    """Keep request ``rid`` running once it has ``tokens`` output tokens: the engine loop
    stops stepping — commands (aborts, flushes, rejections) still run — until the request is
    aborted (by /abort_request or a client disconnect) or finished. A test's round trips then
    never race the request's end, however slow the machine."""
    loop = server.app.state.server.loop
    step = loop._step

    def gated_step() -> bool:
        req = loop.engine.requests.get(rid)
        if (
            req is not None
            and req.to_finish is None
            and not req.finished()
            and len(req.output_ids) >= tokens
        ):
            time.sleep(HOLD_POLL_S)
            return True  # busy: the loop keeps serving commands without stepping
        return step()

    loop._step = (
        gated_step  # the instance attribute shadows the method (the loop thread reads it per step)
    )
    try:
        yield
    finally:
        del loop._step


def encode(text: str, bos: bool = True) -> list[int]:
    return TOKENIZER.encode(text, add_bos=bos)


def open_session(client: httpx.Client, streaming: bool = True, **extra: Any) -> str:
    r = client.post(
        "/open_session", json={"capacity_of_str_len": 1000, "streaming": streaming, **extra}
    )
    assert r.status_code == 200, r.text
    return r.json()


def close_session(client: httpx.Client, sid: str) -> None:
    assert client.post("/close_session", json={"session_id": sid}).status_code == 200


def generate(
    client: httpx.Client,
    ids: list[int] | None = None,
    max_new_tokens: int = 8,
    sid: str | None = None,
    prev: str | None = None,
    *,
    text: str | None = None,
    session: dict[str, Any] | None = None,
    **body: Any,
) -> httpx.Response:
    """POST /generate with SGLang's test sampling (greedy, no stop trim, specials kept)."""
    payload: dict[str, Any] = {
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": 0,
            "no_stop_trim": True,
            "skip_special_tokens": False,
        },
        **body,
    }
    payload.update({"text": text} if text is not None else {"input_ids": ids})
    if sid is not None:
        payload["session_params"] = {"id": sid, "rid": prev, **(session or {})}
    return client.post("/generate", json=payload)


def meta(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return response.json()["meta_info"]


def wait_idle(client: httpx.Client, timeout: float = 20.0) -> dict[str, Any]:
    """The /invariants report once the engine is idle with nothing left in flight."""
    deadline = time.monotonic() + timeout
    while True:
        report = client.get("/invariants").json()
        state = report["engine"]
        if state["idle"] and state["num_requests"] == 0:
            return report
        assert time.monotonic() < deadline, f"engine not idle after {timeout} s: {state}"
        time.sleep(0.02)


def assert_clean_idle(client: httpx.Client, sessions_closed: bool = True) -> dict[str, Any]:
    """Healthy, zero violations, exact idle accounting; with ``sessions_closed`` no session
    or slot is left, so every pool is ``free + evictable + protected == capacity``."""
    report = wait_idle(client)
    assert client.get("/health").status_code == 200
    assert report["healthy"] and report["checker"]["num_violations"] == 0, report["checker"][
        "violations"
    ][:3]
    assert report["checker"]["evaluations"] > 0
    for pool in report["engine"]["pools"]:
        census = pool["census"]
        assert pool["balanced"] and pool["request_owned"] == 0, pool
        assert (
            census["taken"] and census["duplicates"] == census["dangling"] == census["orphans"] == 0
        ), census
        if sessions_closed:
            assert pool["session_held"] == 0
            assert pool["free"] + pool["evictable"] + pool["protected"] == pool["capacity"]
    if sessions_closed:
        assert report["engine"]["open_sessions"] == [] and report["engine"]["session_slots"] == []
    return report
