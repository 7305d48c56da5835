"""The vllm target's pool buckets as flags by block id (invariants/targets/vllm/buckets.py):
written from the records that changed at each view, they hold what a test of every record
gives (``records.buckets_of``) — the counters' sizes, the cache owner in block order, each
holder's blocks no hash covers. Plain Python and numpy: runs without vLLM."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.view import BlockView
from invariants.targets.vllm.buckets import Buckets
from invariants.targets.vllm.records import buckets_of

SIZE = 6
RECORD = st.builds(
    BlockView,
    id=st.integers(0, SIZE - 1),
    ref_cnt=st.integers(-1, 2),
    in_free_queue=st.booleans(),
    hash=st.sampled_from(["", "ab", "cd"]),
    holders=st.integers(0, 2),
    is_null=st.booleans(),
)


@given(st.lists(st.lists(RECORD, max_size=SIZE), max_size=6), st.lists(st.integers(0, SIZE - 1)))
def test_flags_from_the_changed_records_are_every_records_buckets(views, held) -> None:
    """Whatever records change view after view (the null block too, a negative ref_cnt), the
    flags say what the whole records say: each bucket, its size, the cache in block order,
    a holder's blocks without a hash in the holder's order."""
    rows = {i: BlockView(i) for i in range(SIZE)}
    flags = Buckets(SIZE)
    flags.take([tuple(c) for c in zip(*rows.values())])
    for changed in views:
        by_id = {row.id: row for row in changed}  # (a view changes a block once)
        rows |= by_id
        if by_id:
            flags.take([tuple(c) for c in zip(*by_id.values())])
        whole = buckets_of(rows.values())
        assert flags.as_sets() == whole
        counts = flags.counts()
        assert {name: len(whole[name]) for name in counts} == counts
        assert flags.cache().tolist() == sorted(whole["cache"])
        blocks = np.asarray(held, dtype=np.int64)
        assert flags.unhashed(blocks).tolist() == [b for b in held if b not in whole["hashed"]]
