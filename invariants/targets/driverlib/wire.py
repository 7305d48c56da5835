"""One JSON line per answer, encoded by orjson where the engine's venv has it (SGLang's does:
it depends on it) — several times faster than json on a view — else by json. Runs inside the
engine's venv; imports nothing of kvspec.

Keeps: kvspec reads the same values either way (json.loads on its side): the answers hold
dicts with string keys (int keys are written as strings by both), ints, finite floats,
strings, booleans, None, lists and tuples; anything orjson refuses goes through json.
"""

from __future__ import annotations

import json

try:
    import orjson
except ImportError:  # pragma: no cover (vLLM's venv)
    orjson = None


def line(answer: dict) -> str:
    """``answer`` as one line of JSON (no newline)."""
    if orjson is not None:
        try:
            return orjson.dumps(answer, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:
            pass
    return json.dumps(answer)
