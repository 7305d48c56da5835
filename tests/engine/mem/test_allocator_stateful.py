"""Random allocation programs keep the ownership law: the YAML checker runs at level 2
after every rule, over a view whose owners are the test's simulated request rows."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.mem import paging
from engine.mem.allocator import PagedAllocator, SWAAllocator, TokenAllocator
from engine.observe.census import take_census
from engine.view import PoolView, StateView
from invariants.checking.checker import Checker, Level
from invariants.checking.loader import load_catalog

CATALOG = load_catalog()


class AllocatorMachine(RuleBasedStateMachine):
    """Rows grow by extend and decode, shrink by page-aligned tail frees, and are freed
    whole; page ids handed out never overlap and every freed page comes back exactly once."""

    @initialize(ps=st.sampled_from([1, 2, 4, 8]), num_pages=st.integers(6, 24), swa=st.booleans())
    def setup(self, ps: int, num_pages: int, swa: bool) -> None:
        size = ps * num_pages
        if swa:
            self.alloc = SWAAllocator(size, size, ps)
        else:
            self.alloc = TokenAllocator(size) if ps == 1 else PagedAllocator(size, ps)
        self.ps = ps
        self.rows: dict[int, np.ndarray] = {}
        self.next_id = 0
        self.checker = Checker(CATALOG, level=Level.STRICT)
        self.step = 0

    @rule(length=st.integers(1, 24))
    def new_row(self, length: int) -> None:
        out = self.alloc.alloc_extend([0], [length], [-1])
        if out is not None:
            assert len(out) == length
            self.rows[self.next_id] = out
            self.next_id += 1

    @precondition(lambda self: self.rows)
    @rule(pick=st.integers(0, 1 << 16), extra=st.integers(1, 12))
    def extend_row(self, pick: int, extra: int) -> None:
        rid = sorted(self.rows)[pick % len(self.rows)]
        row = self.rows[rid]
        out = self.alloc.alloc_extend([len(row)], [len(row) + extra], [int(row[-1])])
        if out is not None:
            self.rows[rid] = np.concatenate([row, out])

    @precondition(lambda self: self.rows)
    @rule()
    def decode_all(self) -> None:
        rids = sorted(self.rows)
        seq = [len(self.rows[r]) + 1 for r in rids]
        out = self.alloc.alloc_decode(seq, [int(self.rows[r][-1]) for r in rids])
        if out is not None:
            for rid, loc in zip(rids, out):
                self.rows[rid] = np.append(self.rows[rid], loc)

    @precondition(lambda self: self.rows)
    @rule(pick=st.integers(0, 1 << 16), keep=st.integers(0, 40))
    def free_tail(self, pick: int, keep: int) -> None:
        rid = sorted(self.rows)[pick % len(self.rows)]
        row = self.rows[rid]
        start, end = paging.tail_free_range(min(keep, len(row)), len(row), self.ps)
        if start < end:
            self.alloc.free(row[start:end])
            self.rows[rid] = row[:start]
        if start == 0:
            del self.rows[rid]  # nothing kept: the row is gone

    @precondition(lambda self: self.rows)
    @rule(pick=st.integers(0, 1 << 16))
    def free_row(self, pick: int) -> None:
        rid = sorted(self.rows)[pick % len(self.rows)]
        self.alloc.free(self.rows.pop(rid))

    @invariant()
    def yaml_checker_holds(self) -> None:
        self.step += 1
        self.checker.check(
            "step", StateView(step=self.step, page_size=self.ps, pools=self.pool_views())
        )

    def pool_views(self) -> tuple[PoolView, ...]:
        if isinstance(self.alloc, SWAAllocator):
            mapping = self.alloc.full_to_swa
            return (
                self._view("full", self.alloc.full, lambda s: s),
                self._view("swa", self.alloc.swa, lambda s: mapping[s]),
            )
        return (self._view("full", self.alloc, lambda s: s),)

    def _view(self, name: str, alloc: PagedAllocator, translate) -> PoolView:
        owned = [(f"row{rid}", translate(row) // self.ps) for rid, row in self.rows.items()]
        held = sum(paging.ceil_align(len(row), self.ps) for row in self.rows.values())
        return PoolView(
            name=name,
            page_size=self.ps,
            capacity=alloc.size,
            free=alloc.available_size(),
            request_owned=held,
            census=take_census(
                alloc.num_pages, alloc.all_free_pages(), owned, owned, slots_per_page=self.ps
            ),
        )


TestAllocatorMachine = AllocatorMachine.TestCase
