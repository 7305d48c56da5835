"""Views built for reuse are the views a fresh build gives: the positional builder makes the
same object as the dataclass constructor, a request's ReqView is handed out again only while
its fields read the same, and sections left out of a selective view stay at their defaults."""

from __future__ import annotations

from dataclasses import fields

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.snapshot import ReqPlaces, ReqViewCache
from engine.view import SELECTIVE, NodeView, ReqView, StateView, positional_builder


def test_positional_builder_equals_the_constructor() -> None:
    """positional_builder(cls)(*values) == cls(*values), hash and field values included."""
    values = ("r1", 3, 10, 9, 10, 0, 0, 0, False, False, 5, 4, False, True, False, False, True, True, 7, 2)
    built, made = positional_builder(ReqView)(*values), ReqView(*values)
    assert built == made and hash(built) == hash(made) and type(built) is ReqView
    node = tuple(range(len(fields(NodeView))))
    assert positional_builder(NodeView)(*node) == NodeView(*node)


def test_req_views_are_reused_only_while_unchanged() -> None:
    """An unchanged request gets the very same ReqView; a changed one a new, equal-to-fresh one."""
    engine = Engine(EngineConfig(memory=MemoryConfig(max_total_tokens=256)))
    engine.submit([1, 2, 3, 4], SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.step()
    reqs = engine.scheduler.live_reqs()
    cache = ReqViewCache()
    first = cache.views(reqs, ReqPlaces())
    assert cache.views(reqs, ReqPlaces())[0] is first[0]
    moved = cache.views(reqs, ReqPlaces(running=set(reqs)))
    assert moved[0] is not first[0] and moved[0].in_running and moved == ReqViewCache().views(reqs, ReqPlaces(running=set(reqs)))


def test_selective_view_builds_only_named_sections() -> None:
    """With SELECTIVE, unnamed sections are the defaults; the named ones equal a full view's."""
    engine = Engine(EngineConfig(memory=MemoryConfig(max_total_tokens=256)))
    engine.submit([1, 2, 3, 4], SamplingParams(max_new_tokens=4, ignore_eos=True))
    engine.step()
    full = engine.state_view("schedule")
    only = engine.state_view("schedule", frozenset({SELECTIVE, "reqs"}))
    assert only.reqs == full.reqs and only.reqs
    assert only.pools == StateView().pools and only.req_pool == StateView().req_pool
    assert only.sched == full.sched
