"""Models behind the ModelRunner contract (runner.py): ``sim`` (weightless fingerprints,
sim.py) and ``tiny`` (a small seeded transformer over the paged KV pools, tiny.py; its
EAGLE draft, draft.py). Keeps: importing this package imports no torch."""
