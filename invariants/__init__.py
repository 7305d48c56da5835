"""kvspec's invariant harness: YAML catalog, restricted expression language, per-event checker.

Keeps: the dependency direction `engine` ← `invariants` — the harness reads `engine.view` state
views only and attaches to the engine through the step-hook protocol (`CheckerHook`).
"""
