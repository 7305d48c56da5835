"""Shared helpers for the session tests: the configuration matrix (page size × overlap ×
retract × mixed chunk × cache, all pairs), engines checked by the whole shipped catalog at
level 2 (memory, scheduler and session rules), byte-tokenized prompts, and turn helpers.

Keeps: every engine built here has the strict checker attached, so the first violation of
any invariant fails the test with its id; ``finish`` runs to idle (the idle rules run) and
asserts that nothing was recorded.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine, GenerateResult
from engine.model.tokenizer import ByteTokenizer
from engine.request import SamplingParams
from invariants.checking.checker import Checker, CheckerHook, Level
from invariants.checking.loader import load_catalog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sched"))
from sched_support import all_pairs

CATALOG = load_catalog()
TOKENIZER = ByteTokenizer()
BOS = TOKENIZER.bos_token_id
PANGRAM = "The quick brown fox jumps over the lazy dog."
FILLER = " ".join(
    f"{PANGRAM} Sentence {i} of a long shared document about foxes and dogs." for i in range(200)
)

# all pairs of: page size {1, 4, 256} × overlap × retract × mixed chunk × cache kind
MATRIX: list[dict[str, Any]] = all_pairs(
    {
        "page_size": [1, 4, 256],
        "overlap": [True, False],
        "retract": [False, True],
        "mixed": [False, True],
        "cache": ["radix", "chunk", "swa"],
    }
)


def row_id(row: dict[str, Any]) -> str:
    flags = [f"ps{row['page_size']}", row["cache"], "overlap" if row["overlap"] else "normal"]
    flags += ["retract"] if row["retract"] else []
    flags += ["mixed"] if row["mixed"] else []
    return "-".join(flags)


def session_config(
    page_size: int = 1,
    overlap: bool = True,
    retract: bool = False,
    mixed: bool = False,
    cache: str = "radix",
    *,
    context_len: int | None = None,
    total: int | None = None,
    chunk: int | None = None,
    rows: int = 48,
    seed: int = 0,
    streaming: bool = True,
    **extra: Any,
) -> EngineConfig:
    """A streaming-session engine config. Small pages: 16K tokens, chunks of 64; page 256:
    160 pages, chunks of two pages. ``cache="swa"`` adds a SWA pool half the full one."""
    big = page_size >= 256
    total = total or (160 * page_size if big else 16384)
    chunk = chunk or (2 * page_size if big else 64)
    swa = cache == "swa"
    window = max(32, 2 * page_size)
    mem = MemoryConfig(
        page_size=page_size,
        max_total_tokens=total,
        max_num_reqs=rows,
        context_len=context_len or (4096 if big else 2048),
        cache="chunk" if cache == "chunk" else "radix",
        swa_tokens=total // 2 if swa else None,
        sliding_window=window if swa else None,
    )
    return EngineConfig(
        memory=mem,
        seed=seed,
        chunked_prefill_size=chunk,
        enable_overlap=overlap,
        enable_mixed_chunk=mixed,
        test_retract=retract,
        enable_streaming_session=streaming,
        **extra,
    )


def checked_engine(config: EngineConfig) -> tuple[Engine, Checker]:
    """An engine with the whole catalog checked at level 2 at every event."""
    checker = Checker(CATALOG, Level.STRICT)
    return Engine(config, observers=[CheckerHook(checker)]), checker


def engine_for(row: dict[str, Any], **kw: Any) -> tuple[Engine, Checker]:
    return checked_engine(session_config(**row, **kw))


def encode(text: str, bos: bool = True) -> list[int]:
    return TOKENIZER.encode(text, add_bos=bos)


def sp(max_new_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, **kw)


def turn(
    engine: Engine,
    sid: str,
    ids: list[int],
    max_new_tokens: int = 8,
    prev: str | None = None,
    **params: Any,
) -> GenerateResult:
    """One session turn run to idle (SGLang's client: ``{"id": sid, "rid": prev}``)."""
    rid = engine.submit(ids, sp(max_new_tokens), session_params={"id": sid, "rid": prev, **params})
    engine.run_until_idle()
    return engine.pop_result(rid)


def inherit_offset(engine: Engine) -> int:
    """``kv_inherit_offset`` of SGLang's tests: overlap writes the last token's KV (0)."""
    return 0 if engine.config.enable_overlap else -1


def finish(engine: Engine, checker: Checker) -> None:
    """Run to idle (the idle rules run there) and assert no violation was recorded."""
    engine.run_until_idle()
    assert engine.is_idle() and checker.violations == []
    assert checker.stats()["pool.idle_sum"].evaluations > 0
