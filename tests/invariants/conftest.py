"""Fixtures for the harness tests: one-rule compilation and a consistent, realistic state view."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from engine.view import Census, NodeView, PoolView, ReqPoolView, ReqView, StateView, TreeView
from invariants.checking.rule import Rule, compile_rule
from invariants.checking.schema import InvariantSpec

TRIVIAL_FIXTURES = {"pass": {"event": "step", "view": {}}, "fail": {"event": "step", "view": {}}}


def build_rule(expr: str, **fields: Any) -> Rule:
    """Compile one invariant from keyword fields (id, when, for_each, …), fixtures left trivial."""
    data = {
        "id": "t.rule",
        "title": "test rule",
        "when": ["step"],
        "expr": expr,
        "message": "failed",
        "fixtures": TRIVIAL_FIXTURES,
        **fields,
    }
    return compile_rule(InvariantSpec.model_validate(data))


@pytest.fixture
def make_rule() -> Callable[..., Rule]:
    return build_rule


def _ceil(n: int, page: int) -> int:
    return -(-n // page) * page


def _tree(num_nodes: int, page: int) -> TreeView:
    """A binary tree: nodes < 16 locked (paths to the root), < 8 SWA-locked, some tombstones."""
    nodes = [NodeView(id=0, is_root=True, is_leaf=False, lock_ref=1, swa_lock_ref=1)]
    for i in range(1, num_nodes):
        parent = (i - 1) // 2
        locked, swa_locked = int(i < 16), int(i < 8)
        nodes.append(
            NodeView(
                id=i,
                parent=parent,
                is_leaf=2 * i + 1 >= num_nodes,
                key_len=page * (1 + i % 3),
                value_len=page * (1 + i % 3),
                lock_ref=locked,
                parent_lock_ref=int(parent < 16),
                swa_lock_ref=swa_locked,
                parent_swa_lock_ref=int(parent < 8),
                swa_tombstone=not locked and i % 5 == 0,
            )
        )
    body = [n for n in nodes if not n.is_root]
    live = [n for n in body if not n.swa_tombstone]
    return TreeView(
        kind="swa_radix",
        page_size=page,
        evictable_size=sum(n.key_len for n in body if n.lock_ref == 0),
        protected_size=sum(n.key_len for n in body if n.lock_ref > 0),
        swa_evictable_size=sum(n.key_len for n in live if n.swa_lock_ref == 0),
        swa_protected_size=sum(n.key_len for n in live if n.swa_lock_ref > 0),
        nodes=tuple(nodes),
    )


def consistent_view(
    num_reqs: int = 64, num_nodes: int = 128, page: int = 4, event: str = "step"
) -> StateView:
    """A busy hybrid-SWA state in which every memory invariant holds."""
    reqs = tuple(
        ReqView(
            rid=f"r{i}",
            req_pool_idx=i + 1,
            seq_len=40 + i,
            kv_committed_len=40 + i,
            kv_allocated_len=40 + i + i % 3,
            cache_protected_len=2 * page,
            swa_evicted_seqlen=2 * page,
        )
        for i in range(num_reqs)
    )
    tree = _tree(num_nodes, page)
    owned = sum(_ceil(r.kv_allocated_len, page) - r.cache_protected_len for r in reqs)
    cap = 2 * (owned + tree.evictable_size + tree.protected_size)
    full = PoolView(
        name="full",
        page_size=page,
        capacity=cap,
        evictable=tree.evictable_size,
        protected=tree.protected_size,
        request_owned=owned,
        free=cap - tree.evictable_size - tree.protected_size - owned,
        census=Census(num_pages=cap // page),
    )
    swa_used = tree.swa_evictable_size + tree.swa_protected_size + owned
    swa = PoolView(
        name="swa",
        page_size=page,
        capacity=cap,
        evictable=tree.swa_evictable_size,
        protected=tree.swa_protected_size,
        request_owned=owned,
        free=cap - swa_used,
        census=Census(num_pages=cap // page),
    )
    rows = ReqPoolView(
        size=2 * num_reqs,
        rows_in_use=tuple(range(1, num_reqs + 1)),
        free_rows=tuple(range(num_reqs + 1, 2 * num_reqs + 1)),
    )
    return StateView(
        event=event, step=7, page_size=page, pools=(full, swa), tree=tree, req_pool=rows, reqs=reqs
    )


@pytest.fixture
def busy_view() -> StateView:
    return consistent_view()
