"""The server's own contract: a client that disconnects mid-stream aborts its request and its
KV returns; at --strict-mem-check 2 a violation stops admitting work and /health answers 503
naming it, at 1 it is only recorded (/invariants, /metrics); Prometheus text parses; the API
key guards every route but /health and /metrics; session timeouts run on wall time;
/flush_cache only at idle; `kvspec serve` refuses a bad flag combination."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import (
    BASE_ARGS,
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
from typer.testing import CliRunner


def test_disconnect_mid_stream_aborts_and_returns_kv(
    server_client: tuple[LiveServer, httpx.Client],
) -> None:
    """A streaming turn whose client goes away after three tokens is aborted (the scheduler
    counts it), its KV returns (exact accounting at idle, the session's slot intact), and the
    next turn appends to the last successful one."""
    server, client = server_client
    sid = open_session(client)
    first = meta(generate(client, encode("first turn"), 6, sid))
    body = {
        "text": "abandoned",
        "stream": True,
        "rid": "abandoned",
        "sampling_params": {"max_new_tokens": 100000},
        "session_params": {"id": sid},
    }
    with (
        hold_request(server, "abandoned", tokens=3),
        client.stream("POST", "/generate", json=body) as stream,
    ):
        for line in stream.iter_lines():
            if (
                line.startswith("data: {")
                and json.loads(line[6:])["meta_info"]["completion_tokens"] >= 3
            ):
                break  # leaving the block closes the connection mid-stream
        stream.close()
        report = assert_clean_idle(
            client, sessions_closed=False
        )  # the disconnect's abort released the hold
    assert report["engine"]["stats"]["aborted_reqs"] == 1
    third = meta(generate(client, encode("third"), 4, sid))
    assert (
        third["prompt_tokens"]
        == first["prompt_tokens"] + first["completion_tokens"] + len(encode("third")) - 1
    )
    close_session(client, sid)
    assert_clean_idle(client)


def _plant_double_count(monkeypatch: pytest.MonkeyPatch, server: LiveServer) -> None:
    """The #22213 kind of bug: the tree's evictable counter is one too high."""
    cls = type(server.engine.mem.tree_cache)
    real = cls.evictable_size
    monkeypatch.setattr(cls, "evictable_size", lambda self: real(self) + 1)


def test_level_2_violation_stops_admitting(monkeypatch: pytest.MonkeyPatch) -> None:
    """At --strict-mem-check 2, after a violation /health answers 503 naming the invariant,
    new /generate and /open_session answer 503, and /invariants and /metrics report it."""
    with live_server(replace(BASE_ARGS, strict_mem_check=2)) as (server, client):
        _plant_double_count(monkeypatch, server)
        generate(client, encode("trips the checker"), 4)
        health = client.get("/health")
        assert health.status_code == 503 and "pool.busy_sum" in health.json()["error"]["message"]
        refused = generate(client, encode("more"), 4)
        assert (
            refused.status_code == 503
            and "not admitting new work" in refused.json()["error"]["message"]
        )
        assert client.post("/open_session", json={"capacity_of_str_len": 1}).status_code == 503
        report = client.get("/invariants").json()
        assert not report["healthy"] and report["checker"]["by_invariant"]["pool.busy_sum"] >= 1
        assert _samples(client.get("/metrics").text)["kvspec_violations_total"][()] >= 1


def test_level_1_violation_is_recorded_and_serving_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """At --strict-mem-check 1 the same violation is recorded and reported per invariant,
    while /health stays 200 and requests are served."""
    with live_server(replace(BASE_ARGS, strict_mem_check=1)) as (server, client):
        _plant_double_count(monkeypatch, server)
        generate(client, encode("trips the checker"), 4)
        assert client.get("/health").status_code == 200
        assert generate(client, encode("still served"), 4).status_code == 200
        assert client.get("/invariants").json()["checker"]["num_violations"] >= 1
        per = _samples(client.get("/metrics").text)["kvspec_invariant_violations_total"]
        assert per[(("invariant", "pool.busy_sum"),)] >= 1


def _samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Prometheus text → {sample name: {sorted labels: value}} (parsing it is the check)."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_metrics_are_prometheus_text_and_balance(client: httpx.Client) -> None:
    """/metrics parses as Prometheus text; at idle the pool buckets sum to the capacity and
    the step counter has moved."""
    assert generate(client, encode("count me"), 4).status_code == 200
    assert_clean_idle(client)
    samples = _samples(client.get("/metrics").text)
    buckets = samples["kvspec_pool_tokens"]
    capacity = samples["kvspec_pool_capacity_tokens"][(("pool", "full"),)]
    assert sum(v for labels, v in buckets.items() if ("pool", "full") in labels) == capacity
    assert samples["kvspec_steps_total"][()] > 0 and samples["kvspec_violations_total"][()] == 0


def test_api_key_guards_everything_but_health_and_metrics() -> None:
    """With --api-key, requests without the bearer answer 401; /health and /metrics stay open."""
    with live_server(replace(BASE_ARGS, api_key="sekret")) as (_, client):
        assert client.post("/generate", json={"text": "a"}).status_code == 401
        assert client.get("/metrics").status_code == 200
        ok = client.post(
            "/generate",
            json={"text": "a", "sampling_params": {"max_new_tokens": 2}},
            headers={"Authorization": "Bearer sekret"},
        )
        assert ok.status_code == 200
        info = client.get("/get_server_info", headers={"Authorization": "Bearer sekret"}).json()
        assert info["server_args"]["api_key"] == "***" and info["server_args"]["page_size"] == 1


def test_session_timeout_reaps_on_wall_time(client: httpx.Client) -> None:
    """A session idle past its timeout is closed by the idle loop (its slot released)."""
    sid = open_session(client, timeout=0.2)
    assert generate(client, encode("short"), 2, sid).status_code == 200
    deadline = time.monotonic() + 10
    while (
        client.get("/invariants").json()["engine"]["open_sessions"] and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert_clean_idle(client)
    gone = generate(client, encode("late"), 2, sid)
    assert gone.status_code == 400 and "does not exist" in gone.json()["error"]["message"]


def test_flush_cache_only_when_idle(server_client: tuple[LiveServer, httpx.Client]) -> None:
    """/flush_cache answers 400 while a request runs and 200 at idle."""
    server, client = server_client
    body: dict[str, Any] = {
        "text": "busy",
        "stream": True,
        "rid": "long-one",
        "sampling_params": {"max_new_tokens": 100000},
    }
    with hold_request(server, "long-one"), client.stream("POST", "/generate", json=body) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        assert client.post("/flush_cache").status_code == 400
        assert client.post("/abort_request", json={"rid": "long-one"}).status_code == 200
        list(lines)
    assert_clean_idle(client)
    assert client.post("/flush_cache").status_code == 200


def test_serve_refuses_a_bad_flag_combination() -> None:
    """`kvspec serve --speculative-algorithm EAGLE_V2 --disable-overlap-schedule` exits 2
    naming the conflict (EAGLE v2 needs the overlap scheduler)."""
    from invariants.cli import app

    result = CliRunner().invoke(
        app, ["serve", "--speculative-algorithm", "EAGLE_V2", "--disable-overlap-schedule"]
    )
    assert result.exit_code == 2 and "overlap" in result.output


def test_a_next_turn_right_after_a_disconnect_is_not_refused(
    server_client: tuple[LiveServer, httpx.Client],
) -> None:
    """A client that drops a streaming turn and at once sends the next one gets the next
    turn served (the dropped stream's abort lands before the turn is judged), 15 times in a
    row; the session's history is the last successful turn, the accounting exact."""
    _, client = server_client
    sid = open_session(client)
    for i in range(15):
        body = {
            "text": f"turn {i}",
            "stream": True,
            "sampling_params": {"max_new_tokens": 100000},
            "session_params": {"id": sid},
        }
        with client.stream("POST", "/generate", json=body) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")
        follow = generate(client, encode(f"next {i}"), 2, sid)
        assert follow.status_code == 200, (i, follow.text)
    close_session(client, sid)
    assert_clean_idle(client)
