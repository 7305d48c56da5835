"""Who may write a request's KV fields (engine/request.py's module docstring): the row and
the four lengths are assigned only by the memory layer — engine/memory.py and the caches of
engine/cache/ (the streaming cache's slot lending among them) — and by EAGLE's accounting
(engine/speculative/accounting.py). The scheduler, the session controller, the EAGLE worker
and the request itself only read them."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"
KV_FIELDS = frozenset(
    ("req_pool_idx", "kv_committed_len", "kv_allocated_len", "cache_protected_len")
    + ("swa_evicted_seqlen",)
)
WRITERS = ("memory.py", "cache/", "speculative/accounting.py")


def kv_field_writes(path: Path) -> list[str]:
    """``file:line field`` for every assignment (plain or augmented) to a KV field."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in _flat(target)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in KV_FIELDS:
                found.append(f"{path.relative_to(ENGINE.parent)}:{node.lineno} {target.attr}")
    return found


def _flat(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for element in target.elts for t in _flat(element)]
    return [target]


def test_only_the_memory_layer_and_speculative_accounting_write_kv_fields() -> None:
    """No engine module outside the memory layer and EAGLE's accounting assigns
    ``req_pool_idx``, ``kv_committed_len``, ``kv_allocated_len``, ``cache_protected_len`` or
    ``swa_evicted_seqlen`` (of a request, or of anything else: the names are the law's)."""
    writes = []
    for path in sorted(ENGINE.rglob("*.py")):
        relative = path.relative_to(ENGINE).as_posix()
        if not relative.startswith(WRITERS):
            writes += kv_field_writes(path)
    assert writes == []


def test_the_scan_finds_writes() -> None:
    """The scan itself sees plain, tuple, chained and augmented assignments (so the rule
    above cannot pass by not looking)."""
    memory, slot = (
        kv_field_writes(ENGINE / "memory.py"),
        kv_field_writes(ENGINE / "cache/session_slot.py"),
    )
    assert any(w.endswith(" kv_committed_len") for w in memory)  # req.kv_committed_len += 1
    assert any(w.endswith(" req_pool_idx") for w in slot)  # req.req_pool_idx = self.req_pool_idx
    assert any(w.endswith(" kv_allocated_len") for w in slot)  # a, b = ... (a tuple target)
