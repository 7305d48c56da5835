"""A driver's answer line (driverlib/wire.py) reads back as the same values whichever encoder
wrote it: orjson here and in SGLang's venv (SGLang depends on it), msgspec in vLLM's (vLLM
depends on it); an answer line with views carries them after a record separator."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from invariants.targets.sglang.adapter import sglang_python
from invariants.targets.vllm.adapter import vllm_python

DRIVERLIB = Path(__file__).parents[3] / "invariants/targets/driverlib"
ANSWER = {
    "views": [{"pools": [{"name": "full", "census_delta": {"seq": 3, "free_pages": [0, 2, [7]]}}]}],
    "result": None,
    "counts": {1: 2, "r1": (3, 4)},  # int keys become strings; tuples lists
    "ratio": 0.75,
    "ok": True,
}
SCRIPT = f"""
import json, sys
sys.path.insert(0, {str(DRIVERLIB)!r})
import wire
def int_keys(d):
    return {{(int(k) if k == "1" else k): v for k, v in d.items()}}
answer = json.loads(sys.stdin.read(), object_hook=int_keys)
print("orjson" if wire.orjson is not None else "msgspec" if wire._MSGSPEC else "json")
print(wire.line(answer))
"""


def _expected() -> object:
    return json.loads(json.dumps(ANSWER))


def _wire() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvspec_wire", DRIVERLIB / "wire.py")
    assert spec is not None and spec.loader is not None
    wire = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wire)
    return wire


def test_the_json_line_reads_back_as_json_writes_it() -> None:
    """In kvspec's venv the line reads back as json's own."""
    assert json.loads(_wire().line(ANSWER)) == _expected()


def test_an_answer_line_puts_its_views_after_a_record_separator() -> None:
    """The head (result, counts) reads alone; the views after 0x1e read as the views; an
    answer without views is one plain line."""
    head, split, views = _wire().answer_line(ANSWER).partition("\x1e")
    expected = _expected()
    assert split and json.loads(views) == expected.pop("views")  # type: ignore[attr-defined]
    assert json.loads(head) == expected
    assert "\x1e" not in _wire().answer_line({"views": [], "result": 3})


def _written_by(python: Path) -> tuple[str, str]:
    out = subprocess.run(
        [str(python), "-c", SCRIPT],
        input=json.dumps(ANSWER),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    used, line = out.stdout.splitlines()
    return used, line


@pytest.mark.sglang
def test_orjson_in_sglangs_venv_writes_the_same_values() -> None:
    """In SGLang's venv orjson writes it, and it reads back the same."""
    used, line = _written_by(sglang_python())
    assert used == "orjson"
    assert json.loads(line) == _expected()


@pytest.mark.vllm
def test_msgspec_in_vllms_venv_writes_the_same_values() -> None:
    """In vLLM's venv msgspec writes it, and it reads back the same."""
    used, line = _written_by(vllm_python())
    assert used == "msgspec"
    assert json.loads(line) == _expected()
