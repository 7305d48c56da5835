"""The vllm driver reads a block again only when vLLM wrote to it (driver/pool_reads.py,
driver/writes.py), and kvspec's side derives the records from those reads (pool.py,
records.py): on vLLM's own BlockPool, taking blocks re-reads exactly those blocks, a table that
grows re-counts only what it added, and a write that no hook saw — the one thing that could
make an incremental read wrong — is caught by the cross-check's whole read. The driver's half
runs under the vllm venv's python (its modules import vLLM)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from invariants.targets.vllm.adapter import vllm_python
from invariants.targets.vllm.pool import PoolMirror

pytestmark = pytest.mark.vllm
DRIVER = Path(__file__).parents[4] / "invariants/targets/vllm/driver"

SCRIPT = """
import json, sys
sys.path[:0] = [{driver!r}, {driverlib!r}]
import pool_reads, views, writes
from vllm.v1.core.block_pool import BlockPool

pool = BlockPool(8, True, 1)
reads, out = pool_reads.PoolReads(writes.record()), []
def read(held):
    owners = {{"kinds": {{rid: "req" for _, rid in held}}, "fenced": {{}}}}
    out.append(reads.read(pool, held, set(held) | set(reads.held), owners))

read({{}})
taken = pool.get_new_blocks(2)
held = {{(0, "r"): [b.block_id for b in taken]}}
read(held)
read(held)
grown = pool.get_new_blocks(1)
read({{(0, "r"): held[0, "r"] + [grown[0].block_id]}})
pool_reads.CROSSCHECK = True
object.__setattr__(taken[0], "ref_cnt", 5)  # a write past the hook
read({{(0, "r"): held[0, "r"] + [grown[0].block_id]}})
object.__setattr__(taken[0], "ref_cnt", 1)  # (put back) ... and a link written past it
object.__setattr__(pool.blocks[4], "next_free_block", pool.blocks[6])
read({{(0, "r"): held[0, "r"] + [grown[0].block_id]}})
writes.stop()
print(json.dumps(out))
"""


def _run(script: str = SCRIPT) -> list:
    """``script``'s last line of JSON, run by the vllm venv's python beside the driver."""
    script = script.format(driver=str(DRIVER), driverlib=str(DRIVER.parent.parent / "driverlib"))
    out = subprocess.run(
        [str(vllm_python()), "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_only_written_blocks_are_read_again_and_a_missed_write_is_caught() -> None:
    """The first view reads every block (the null block and 7 more); taking two re-reads those
    two; a view with nothing written reads none; a grown table re-reads the one block added;
    a ref count, or a free-queue link, written past the hook is named by the cross-check's
    full read. Taking two unlinks them from the queue's front: the links read are the two
    taken (linked to none now, -3) and the fake head's (block 3 now)."""
    first, taken, unchanged, grown, unhooked, unlinked = _run()
    assert first["blocks"][0] == list(range(8)) and first["whole"]
    assert first["links"] == [1, list(range(8)), [-3, 2, 3, 4, 5, 6, 7, -1]]
    assert taken["links"] == [3, [1, 2], [-3, -3]]
    assert unchanged["links"] == [3, [], []]
    table = taken["tables"][0]  # [group, rid, start, kept, tail]
    assert taken["blocks"][0] == sorted(table[4]) and len(table[4]) == 2
    assert unchanged["blocks"][0] == [] and unchanged["tables"] == []
    assert grown["blocks"][0] == grown["tables"][0][4]  # the one block the table gained
    mirror = PoolMirror()
    changed = [mirror.view(_view(read))["block_records"] for read in (first, taken, unchanged)]
    assert [len(c.fresh) for c in changed] == [8, 2, 0]
    mirror.view(_view(grown))
    assert mirror.records.queue.walk.tolist() == [4, 5, 6, 7]
    with pytest.raises(AssertionError, match="a write the driver did not re-read"):
        mirror.view(_view(unhooked))
    mirror = PoolMirror()
    for read in (first, taken, unchanged, grown):
        mirror.view(_view(read))
    with pytest.raises(AssertionError, match="free queue walked from the driver's links"):
        mirror.view(_view(unlinked))


def _view(read: dict) -> dict:
    return {"event": "step", "step": 1, "page_size": 1, "pool": read}


LISTING = """
import json, sys
sys.path[:0] = [{driver!r}, {driverlib!r}]
import pool_reads
from vllm.v1.core.block_pool import BlockHashToBlockMap
from vllm.v1.core.kv_cache_utils import KVCacheBlock

blocks = [KVCacheBlock(i) for i in range(4)]
cache, numbers = BlockHashToBlockMap(), pool_reads.HashIds()
one, two, gone = b"a" * 36, b"b" * 36, b"c" * 36
cache.insert(one, blocks[1])
cache.insert(two, blocks[2])
cache.insert(two, blocks[3])  # one hash, two blocks: a dict entry
listing = pool_reads.map_listing(cache, [one, two, gone], numbers)
print(json.dumps([listing, numbers.take()]))
"""


def test_a_key_lists_one_block_several_or_none() -> None:
    """The hash map's listing of written keys, each as its number in the run: a key over one
    block, over two (vLLM keeps a dict then), and a key no longer in the map (none); the
    numbers' short hexes come once, in number order."""
    listing, shorts = _run(LISTING)
    assert listing == [[1, [1]], [2, [2, 3]], [3, []]]
    assert shorts == ["61" * 12, "62" * 12, "63" * 12]
