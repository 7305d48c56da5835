"""Sessions as tags over the radix tree at the Engine (SGLang --enable-session-radix-cache,
#27058/#29173, top-level ``session_id`` #29436), every event checked by the whole catalog
at level 2."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.errors import ConfigError
from engine.request import SamplingParams
from invariants.checking.checker import Checker
from tests.engine.sessions.session_support import checked_engine, encode

GEN = SamplingParams(max_new_tokens=4, ignore_eos=True)


def tagged_engine(
    page_size: int = 1, overlap: bool = True, streaming: bool = False
) -> tuple[Engine, Checker]:
    mem = MemoryConfig(
        page_size=page_size, max_total_tokens=512, max_num_reqs=8, session_radix_cache=True
    )
    return checked_engine(
        EngineConfig(memory=mem, enable_overlap=overlap, enable_streaming_session=streaming)
    )


def frontiers(engine: Engine) -> dict[str, list[int]]:
    refs = engine.mem.session_refs
    assert refs is not None
    return {sid: list(nodes) for sid, nodes in refs.frontiers.items()}


def finish(engine: Engine, checker: Checker) -> None:
    engine.run_until_idle()
    assert checker.violations == []


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("overlap", [True, False])
def test_a_top_level_session_id_tags_without_an_open(page_size: int, overlap: bool) -> None:
    """Turns with a top-level session_id are ordinary radix requests (no open, no slot);
    each finished turn's KV is tagged, the second turn reuses the first's prefix, and close
    drops the tags while the KV stays cached and evictable."""
    engine, checker = tagged_engine(page_size, overlap)
    history = encode("You are a careful assistant. Question one?")
    engine.submit(history, GEN, "t1", session_id="chat")
    finish(engine, checker)
    first = engine.pop_result("t1")
    history += list(first.output_ids) + encode(" And question two?", bos=False)
    engine.submit(history, GEN, "t2", session_id="chat")
    finish(engine, checker)
    assert engine.pop_result("t2").cached_tokens > 0
    assert list(frontiers(engine)) == ["chat"] and len(frontiers(engine)["chat"]) == 1
    evictable = engine.mem.tree_cache.evictable_size()
    assert engine.close_session("chat") is True
    finish(engine, checker)
    assert frontiers(engine) == {}
    assert engine.mem.tree_cache.evictable_size() == evictable > 0
    assert engine.close_session("chat") is False  # unknown now: SGLang answers 200 and logs


def test_non_streaming_sessions_tag_and_streaming_ones_do_not() -> None:
    """An opened non-streaming session's turns tag the tree; a streaming session keeps its
    KV in its slot and tags nothing (SGLang skips streaming sessions)."""
    engine, checker = tagged_engine(streaming=True)
    engine.open_session(256, "plain")
    engine.open_session(256, "live", streaming=True)
    engine.submit(encode("plain turn"), GEN, "p1", session_params={"id": "plain"})
    engine.submit(encode("streaming turn"), GEN, "s1", session_params={"id": "live"})
    finish(engine, checker)
    assert list(frontiers(engine)) == ["plain"]
    engine.close_session("plain")
    engine.close_session("live")
    finish(engine, checker)
    assert frontiers(engine) == {}


def test_flush_forgets_every_tag() -> None:
    """A flush drops the tree, so the tags go with it; the session tags again afterwards."""
    engine, checker = tagged_engine()
    engine.submit(encode("before the flush"), GEN, "a1", session_id="a")
    finish(engine, checker)
    assert engine.flush_cache() and frontiers(engine) == {}
    engine.submit(encode("after the flush"), GEN, "a2", session_id="a")
    finish(engine, checker)
    assert list(frontiers(engine)) == ["a"]


def test_without_the_flag_a_top_level_session_id_names_an_open_session() -> None:
    """Without session tags, ``session_id`` is ``session_params={"id": ...}``: an unknown
    session is SGLang's 400."""
    mem = MemoryConfig(max_total_tokens=512, max_num_reqs=8)
    engine, checker = checked_engine(EngineConfig(memory=mem))
    engine.submit(encode("hello"), GEN, "r1", session_id="nope")
    finish(engine, checker)
    result = engine.pop_result("r1")
    assert result.finish_reason.kind == "abort" and result.finish_reason.status_code == 400
    with pytest.raises(ValueError, match="mutually exclusive"):
        engine.submit([1, 2], GEN, "r2", session_id="a", session_params={"id": "a"})


@pytest.mark.parametrize("fields", [{"cache": "chunk"}, {"swa_tokens": 256, "sliding_window": 16}])
def test_session_tags_need_the_full_attention_radix_tree(fields: dict[str, object]) -> None:
    """The flag names what it needs (SGLang: UnifiedRadixCache)."""
    with pytest.raises(ConfigError, match="session_radix_cache"):
        MemoryConfig(session_radix_cache=True, **fields)
