"""`kvspec serve` as an operator runs it: a start-up line naming the address, model, page
size, strict level and the number of invariants; uvicorn's access log at ``--log-level
info``; a bad log level refused; Ctrl-C while a request streams aborts it and stops with the
accounting exact (the engine loop drains to idle before its thread ends)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
from server_harness import BASE_ARGS, LiveServer, hold_request

from engine.server.metrics import engine_state


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"kvspec serve on {url} never became healthy")


def test_serve_prints_a_startup_line_and_an_access_log() -> None:
    """The first line says where and how the server checks; each request is logged; SIGINT
    stops it with status 0."""
    port = _free_port()
    command = [sys.executable, "-m", "invariants.cli", "serve", "--port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        r = httpx.post(f"http://127.0.0.1:{port}/generate", json={"text": "hi"}, timeout=30)
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    first = out.splitlines()[0]
    assert first.startswith(f"kvspec serve: http://127.0.0.1:{port} · model sim · page size 1")
    assert "strict level 1 (" in first and "invariants checked at every scheduler event" in first
    assert '"POST /generate HTTP/1.1" 200' in out
    assert proc.returncode == 0, out


def test_a_bad_log_level_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "invariants.cli", "serve", "--log-level", "loud"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--log-level 'loud'" in done.stdout + done.stderr


def test_shutdown_aborts_what_runs_and_ends_with_exact_accounting() -> None:
    """A stream still running when the server stops gets its aborted result; the engine is
    idle with every pool balanced and nothing request-owned, and no invariant fired."""
    server = LiveServer(BASE_ARGS)
    server.start()
    body = {
        "text": "long",
        "rid": "late",
        "stream": True,
        "sampling_params": {"max_new_tokens": 100000},
    }
    with hold_request(server, "late", tokens=2), httpx.Client(base_url=server.url) as client:
        with client.stream("POST", "/generate", json=body) as stream:
            assert next(stream.iter_lines()).startswith("data: ")
            server.stop()
    engine = server.app.state.server.loop.engine
    assert engine.is_idle() and engine.requests == {}
    state = engine_state(engine)
    for pool in state["pools"]:
        assert pool["balanced"] and pool["request_owned"] == 0, pool
        assert pool["census"]["orphans"] == pool["census"]["dangling"] == 0, pool
    monitor = server.app.state.server.monitor
    assert monitor.health()[0], monitor.health()
    assert monitor.report()["num_violations"] == 0
