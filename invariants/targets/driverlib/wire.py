"""One JSON line per answer, encoded by orjson where the engine's venv has it (SGLang's does:
it depends on it), else by msgspec (vLLM's does) — several times faster than json on a
view — else by json. Runs inside the engine's venv; imports nothing of kvspec.

Keeps: kvspec reads the same values either way (orjson.loads on its side, json's values): the
answers hold dicts with string keys (int keys are written as strings by all three), ints of
64 bits at most (ids, counts, tokens: a longer one orjson would read as a float), finite
floats, strings, booleans, None, lists and tuples; anything the fast encoder refuses goes
through json. ``answer_line`` puts an answer's views after a record separator (0x1e, which JSON
never holds unescaped): kvspec reads the head first, sends the next op, and decodes the views
while the driver runs it (invariants/targets/driver.py).
"""

from __future__ import annotations

import json

try:
    import orjson
except ImportError:  # pragma: no cover (vLLM's venv)
    orjson = None
try:
    from msgspec.json import Encoder
except ImportError:  # pragma: no cover (SGLang's venv has orjson first)
    Encoder = None

_MSGSPEC = Encoder() if Encoder is not None else None


def line(answer: dict) -> str:
    """``answer`` as one line of JSON (no newline)."""
    try:
        if orjson is not None:
            return orjson.dumps(answer, option=orjson.OPT_NON_STR_KEYS).decode()
        if _MSGSPEC is not None:
            return _MSGSPEC.encode(answer).decode()
    except TypeError:
        pass
    return json.dumps(answer)


VIEWS = "\x1e"  # between an answer's head and its views


def answer_line(answer: dict) -> str:
    """``answer`` as one line: its head, then (if it has any) its views after ``VIEWS``."""
    views = answer.get("views")
    if not views:
        return line(answer)
    head = {k: v for k, v in answer.items() if k != "views"}
    return line(head) + VIEWS + line(views)  # type: ignore[arg-type]
