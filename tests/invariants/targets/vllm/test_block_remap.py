"""The vllm driver re-reads only the hash-map keys vLLM wrote (driver/records.py ``_remap``).
Two keys can print the same short hex — one block hash in two KV groups (the group id is the
key's last 4 bytes) — and a block moved from one to the other within a step must stay listed
whichever key is re-read first. (vLLM 0.33.0's seed 6 broke this under some PYTHONHASHSEEDs,
which order a set of keys: a driver error the cross-check named, reported as a finding.)
Plain Python: runs without vLLM."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

DRIVER = Path(__file__).parents[4] / "invariants/targets/vllm/driver"


@pytest.fixture
def records() -> ModuleType:
    """The driver's own module, loaded from its file (SGLang's drivers have a records.py too)."""
    spec = importlib.util.spec_from_file_location("vllm_driver_records", DRIVER / "records.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("order", [0, 1])
def test_a_block_moved_between_same_hex_keys_stays_listed(records, order: int) -> None:
    block_hash = bytes(range(32))
    in_group = {g: block_hash + g.to_bytes(4, "big") for g in (0, 1)}
    assert records.hex_of(in_group[0]) == records.hex_of(in_group[1])
    block = SimpleNamespace(block_id=2)
    pool_map = SimpleNamespace(_cache={in_group[1]: block})
    rec = records.Records(None)
    rec.map = pool_map
    rec.mapped, rec.under = records.read_map(pool_map)
    pool_map._cache = {in_group[0]: block}  # evicted from group 1, cached again in group 0
    keys = [in_group[1], in_group[0]][:: 1 if order else -1]
    assert rec._remap(keys) == {2}
    assert rec.mapped[2] == {records.hex_of(in_group[0])}
    assert rec.under == {in_group[0]: (2,)}
