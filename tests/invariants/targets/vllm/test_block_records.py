"""The vllm driver reads a block's record again only when vLLM wrote to it (driver/records.py,
driver/writes.py): on vLLM's own BlockPool, taking blocks re-reads exactly those blocks, a table
that grows re-counts only what it added, and a write that no hook saw — the one thing that
could make an incremental read wrong — is caught by the cross-check's full read. Run under the
vllm venv's python (the driver's modules import vLLM)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from invariants.targets.vllm.adapter import vllm_python

pytestmark = pytest.mark.vllm
DRIVER = Path(__file__).parents[4] / "invariants/targets/vllm/driver"

SCRIPT = """
import sys
sys.path[:0] = [{driver!r}, {driverlib!r}]
import records, views, writes
from vllm.v1.core.block_pool import BlockPool

pool = BlockPool(8, True, 1)
rec = records.Records(writes.record())
def ids(held):
    columns = rec.changes(pool, views.free_walk(pool), held, set(held))
    return columns[0] if columns else []

print("first", ids({{}}))
taken = pool.get_new_blocks(2)
held = {{"r": [b.block_id for b in taken]}}
print("taken", ids(held), [b.block_id for b in taken])
print("unchanged", ids(held))
grown = pool.get_new_blocks(1)
print("grown", ids({{"r": held["r"] + [grown[0].block_id]}}), grown[0].block_id)
records.CROSSCHECK = True
object.__setattr__(taken[0], "ref_cnt", 5)  # a write past the hook
try:
    ids({{"r": held["r"] + [grown[0].block_id]}})
    print("missed")
except AssertionError as exc:
    print("caught", exc)
writes.stop()
"""


def _run() -> dict[str, str]:
    script = SCRIPT.format(driver=str(DRIVER), driverlib=str(DRIVER.parent.parent / "driverlib"))
    out = subprocess.run(
        [str(vllm_python()), "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(line.split(" ", 1) for line in out.stdout.splitlines())


def test_only_written_blocks_are_read_again_and_a_missed_write_is_caught() -> None:
    """The first view reads every block (the null block and 7 more); taking two re-reads those
    two; a view with nothing written reads none; a grown table re-reads the one block added;
    a ref count written past the hook is named by the cross-check's full read."""
    lines = _run()
    assert lines["first"] == str(list(range(8)))
    taken, ids = lines["taken"].split("] [")
    assert taken + "]" == "[" + ids
    assert lines["unchanged"] == "[]"
    grown, block = lines["grown"].rsplit(" ", 1)
    assert grown == f"[{block}]"
    assert lines["caught"].startswith("block records read incrementally differ at blocks")
    assert "missed" not in lines
