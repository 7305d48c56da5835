"""The engine's own numbers for ``/invariants`` and ``/metrics``: pool buckets, the exact
census, sessions, scheduler counters; and the Prometheus text rendering.

Keeps: read-only — built from ``Engine.state_view`` (counters and census exactly as the
checker reads them) and the scheduler's stats, on the engine loop thread. ``balanced`` is
SGLang's idle sum ``free + evictable + protected + session_held + request_owned ==
capacity``; at idle with every session closed the last two are 0, so the sum is SGLang's
``free + evictable + protected == total``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.core import Metric as PromMetric

from engine.engine import Engine
from engine.server.monitor import Metric
from engine.view import POOL_BUCKETS, Census, PoolView

STAT_COUNTERS = {
    "iterations": "steps",
    "forward_ct": "forwards",
    "finished_reqs": "finished_requests",
    "aborted_reqs": "aborted_requests",
    "retracted_reqs": "retracted_requests",
    "chunked_prefills": "chunked_prefills",
    "cached_tokens": "cached_tokens",
    "evicted_tokens": "evicted_tokens",
    "wedge_reclaims": "session_slots_reclaimed",  # the wedge breaker (engine/sched/wedge.py)
}  # SchedulerStats field -> metric name


def census_summary(census: Census) -> dict[str, Any]:
    """Counts of each census finding, with the first few page ids."""
    return {
        "taken": census.taken,
        "duplicates": len(census.duplicates),
        "dangling": len(census.dangling),
        "orphans": len(census.orphans),
        "free_repeats": len(census.free_repeats),
        "examples": {
            "duplicates": [asdict(p) for p in census.duplicates[:4]],
            "dangling": [asdict(p) for p in census.dangling[:4]],
            "orphans": list(census.orphans[:8]),
        },
    }


def pool_summary(pool: PoolView) -> dict[str, Any]:
    buckets = {name: getattr(pool, name) for name in POOL_BUCKETS}
    return {
        "name": pool.name,
        "page_size": pool.page_size,
        "capacity": pool.capacity,
        **buckets,
        "balanced": sum(buckets.values()) == pool.capacity,
        "census": census_summary(pool.census),
    }


def engine_state(engine: Engine) -> dict[str, Any]:
    """Pools (counters and census), requests, sessions and slots, scheduler counters."""
    view = engine.state_view("step")
    cache, refs = engine.mem.streaming, engine.mem.session_refs
    stats = engine.stats
    return {
        "step": view.step,
        "idle": engine.is_idle(),
        "pools": [pool_summary(p) for p in view.pools],
        "num_waiting": view.sched.num_waiting,
        "num_running": view.sched.num_running,
        "num_requests": len(engine.requests),
        "open_sessions": sorted(engine.sessions.sessions),
        "session_slots": sorted(cache.slots) if cache else [],
        "tagged_sessions": sorted(refs.frontiers) if refs else [],  # session-radix tags
        "req_rows_in_use": len(view.req_pool.rows_in_use),
        "stats": {name: getattr(stats, name) for name in STAT_COUNTERS},
    }


def engine_metrics(state: dict[str, Any]) -> list[Metric]:
    """Metric families of an ``engine_state`` snapshot."""
    return [*_pool_metrics(state["pools"]), *_engine_counters(state)]


def _pool_metrics(pools: list[dict[str, Any]]) -> list[Metric]:
    """Each pool's buckets, capacity and census findings."""
    buckets = tuple(
        ({"pool": p["name"], "bucket": b}, float(p[b])) for p in pools for b in POOL_BUCKETS
    )
    capacity = tuple(({"pool": p["name"]}, float(p["capacity"])) for p in pools)
    findings = tuple(
        ({"pool": p["name"], "kind": k}, float(p["census"][k]))
        for p in pools
        for k in ("duplicates", "dangling", "orphans", "free_repeats")
    )
    return [
        Metric("kvspec_pool_tokens", "KV slots per pool and ownership bucket", "gauge", buckets),
        Metric("kvspec_pool_capacity_tokens", "KV slots per pool", "gauge", capacity),
        Metric(
            "kvspec_census_findings", "Exact-census findings per pool and kind", "gauge", findings
        ),
    ]


def _engine_counters(state: dict[str, Any]) -> list[Metric]:
    """Requests waiting and running, open sessions, the scheduler's counters."""
    requests = (
        ({"state": "waiting"}, float(state["num_waiting"])),
        ({"state": "running"}, float(state["num_running"])),
    )
    no_labels: dict[str, str] = {}
    sessions = ((no_labels, float(len(state["open_sessions"]))),)
    tagged = ((no_labels, float(len(state["tagged_sessions"]))),)
    return [
        Metric("kvspec_requests", "Requests waiting and running", "gauge", requests),
        Metric("kvspec_open_sessions", "Open sessions", "gauge", sessions),
        Metric("kvspec_tagged_sessions", "Sessions tagging radix KV", "gauge", tagged),
        *(
            Metric(
                f"kvspec_{STAT_COUNTERS[name]}",
                f"Scheduler counter {name}",
                "counter",
                (({}, float(value)),),
            )
            for name, value in state["stats"].items()
        ),
    ]


class _Families:
    """A one-shot prometheus_client collector over metric records."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterator[PromMetric]:
        for m in self.metrics:
            names = sorted({k for labels, _ in m.samples for k in labels})
            family_type = GaugeMetricFamily if m.kind == "gauge" else CounterMetricFamily
            family = family_type(m.name, m.help, labels=names)
            for labels, value in m.samples:
                family.add_metric([labels.get(k, "") for k in names], value)
            yield family


def render(metrics: Iterable[Metric]) -> bytes:
    """The Prometheus text exposition of ``metrics``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(metrics))
    return generate_latest(registry)
