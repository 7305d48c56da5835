"""Cross-check mode: every fast path beside the from-scratch evaluation it stands for.

The harness's fast paths — the incremental census (census_incremental.py), the reused
request views (req_views.py) and the checker's fused test with its node memos
(invariants/checking/fastpath.py) — may only answer what the slow evaluation would. With
``KVSPEC_CROSSCHECK=1`` in the environment (``--crosscheck`` on run, report and explore sets
it, so worker processes inherit it) each one is computed both ways at every event and the
first disagreement stops the run with both results named: a harness bug, never a finding
about the engine, so no crash handler turns it into one.
"""

from __future__ import annotations

import os

ENV = "KVSPEC_CROSSCHECK"


def crosscheck_enabled() -> bool:
    """Whether this process runs in cross-check mode (read when a checker or an engine's
    view memo is built)."""
    return os.environ.get(ENV, "") not in ("", "0")


class CrossCheckMismatch(AssertionError):
    """A fast path answered differently from its from-scratch evaluation."""

    def __init__(self, what: str, fast: object, scratch: object) -> None:
        super().__init__(
            f"cross-check: {what} differs\n  fast path:    {fast!r}\n  from scratch: {scratch!r}"
        )
        self.what, self.fast, self.scratch = what, fast, scratch


def cross_check(what: str, fast: object, scratch: object) -> None:
    """Raise CrossCheckMismatch unless the two answers are equal; of two equally long
    tuples, the first item that differs is named."""
    if fast == scratch:
        return
    if isinstance(fast, tuple) and isinstance(scratch, tuple) and len(fast) == len(scratch):
        i = next(i for i, (a, b) in enumerate(zip(fast, scratch)) if a != b)
        raise CrossCheckMismatch(f"{what}[{i}]", fast[i], scratch[i])
    raise CrossCheckMismatch(what, fast, scratch)


__all__ = ["ENV", "CrossCheckMismatch", "cross_check", "crosscheck_enabled"]
