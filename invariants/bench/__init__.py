"""Benchmarks (`kvspec bench`; results: docs/benchmarks.md): sim.py (`bench sim`: scheduler
steps/s of the sim-model engine, checker off / sums / full; one timed run: timing.py; the
numbers of a result: summary.py), anchor.py (`bench anchor`: the anchor workload on kvspec's
memory path, beside a real engine's own), targets.py (`bench target`: a real engine, checked
vs unchecked), serve.py (`bench serve`: sessions × turns over HTTP); the machine facts every
result records: invariants/machine.py.
`bench kernels` lives with the kernels (`kernels.bench`).

Keeps: timing belongs here, never in a pass/fail test; each result names its machine.
"""
