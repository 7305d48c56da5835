"""Scenarios: what the engine is driven with — a scenario spec (specs/*.yaml) or a matrix cell
of it → a seeded op trace → a run through the engine under the checker → an outcome
(spec.py, scenario_schema.py, scenario.py, ops.py, trace_run.py, runner.py,
scenario_oracles.py, matrix_axes.py, matrix.py; workload.py and memory_exercise.py: the seeded
anchor workload and the memory-layer exercise it drives).

Keeps: a run is a pure function of its spec or seed, so every finding replays; this layer
imports `invariants.checking` and nothing above it.
"""
