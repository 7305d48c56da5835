"""Checking: the YAML catalog (catalog/*.yaml) → validated, compiled rules → the per-event
checker (dsl.py, message.py, schema.py, rule.py, loader.py, checker.py; its fast path:
fastpath.py, fusion.py, memos.py).

Keeps: the bottom layer of the harness — it reads `engine.view` state views only and imports
nothing else of `invariants`.
"""
