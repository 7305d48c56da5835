"""A regression the stateful test found (hypothesis, ci profile): under overlap, the chunked
request's checkpoint moved its SWA lock to the new last node while its previous chunk was still
in flight, reading its window from further back; the next batch's allocation evicted that
window's SWA KV from the tree (``sched.inflight_reads_held``: launched batch #44 reads swa slot
74 for req-16, freed by another owner). The checkpoint now keeps the in-flight chunk's span in
the SWA lock (``KVMemory.checkpoint(reads_back=...)``). The example replays as hypothesis
printed it; the whole catalog runs at level 2 at every event."""

from __future__ import annotations

from tests.invariants.checking.test_engine_stateful import EngineMachine

FIRST = [(1, 69, 65536, 28), (41, 54, 3551, 24), (12, 77, 11484, 13), (164, 87, 19, 29),
         (119, 53, 31491, 32), (1, 0, 0, 1), (1, 0, 0, 1), (41, 33, 0, 1)]  # fmt: skip
SUBMITS = {  # before the step of that index: (length, max_new, seed, shared)
    0: [(19, 1, 0, 33), (186, 20, 171, 57)],
    2: [(143, 1, 1130, 38), (204, 11, 3376, 62)],
    3: [(27, 20, 3146, 2)],
    6: [(27, 30, 1088, 59)],
    7: [(28, 3, 299, 73)],
    10: [(158, 1, 0, 73), (144, 1, 0, 41)],
}
STEPS = [6, 5, 7, 3, 1, 3, 3, 8, 1, 3, 5]


def test_the_launched_chunk_keeps_its_window_through_the_checkpoint() -> None:
    """ps 1, SWA pools, radix tree, overlap, chunks of 64, a retract every 3 forwards: the
    hypothesis example runs to idle with no violation."""
    state = EngineMachine()
    state.setup(
        ps=1,
        swa=True,
        chunk=64,
        interval=3,
        radix=True,
        retract=True,
        first=FIRST,
        seed=2,
        overlap=True,
        mixed=False,
    )
    for index, n in enumerate(STEPS):
        for length, max_new, seed, shared in SUBMITS.get(index, []):
            state.submit(length=length, max_new=max_new, seed=seed, shared=shared)
        state.step(n=n)
    state.teardown()
