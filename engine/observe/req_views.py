"""The request part of a state view: one ``ReqView`` per live request, where the scheduler
holds it, and (under EAGLE) the speculative worker's view of it.

Keeps: a ReqView reads exactly what its request holds at the event — the fields of
``REQ_COPIED`` as the Req has them (one ``attrgetter`` call, named by ReqView itself), the
rest derived below in ReqView's order — and an unchanged request is handed the very same
view object again (``ReqViewCache``: a ReqView is a value, so an equal one is as good as a
new one, and an unchanged one is recognised by identity downstream).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from operator import attrgetter
from typing import NamedTuple

from engine.request import Req
from engine.view import REQ_COPIED, ReqView

SpecState = Callable[[Req], "tuple[int, int] | None"]  # (seq_len, accept_len) of a request
NO_SPEC = (-1, 0)  # ReqView's spec_seq_len, spec_accept_len without speculative state
# ReqView's derived fields, in order: each is computed by ``ReqViewCache.views``
DERIVED = (
    "req_pool_idx",
    "seq_len",
    "origin_len",
    "num_output",
    "finished",
    "to_finish",
    "in_waiting",
    "in_running",
    "in_batch",
    "spec_seq_len",
    "spec_accept_len",
)
if ReqView._fields != REQ_COPIED + DERIVED:  # a field added to ReqView must be derived here
    raise TypeError(f"ReqView's fields {ReqView._fields} != {REQ_COPIED} + {DERIVED}")
_copied = attrgetter(*REQ_COPIED)


class ReqPlaces(NamedTuple):
    """Where the scheduler holds each request (sets of requests; Req hashes by identity)."""

    waiting: Collection[Req] = frozenset()
    running: Collection[Req] = frozenset()
    batch: Collection[Req] = frozenset()  # this iteration's batch


NOWHERE = ReqPlaces()


class ReqViewCache:
    """The last ReqView built for each request, handed out again while it reads the same;
    ``spec_state`` (EAGLE's worker) fills the speculative fields."""

    __slots__ = ("_last", "spec_state")

    def __init__(self, spec_state: SpecState | None = None) -> None:
        # keyed by the Req itself (it hashes by identity, and the key keeps it alive)
        self._last: dict[Req, ReqView] = {}
        self.spec_state = spec_state

    def views(self, reqs: list[Req], places: ReqPlaces) -> tuple[ReqView, ...]:
        last, out, new, spec_state = self._last, [], tuple.__new__, self.spec_state
        waiting, running, batch = places
        same = batch is running  # a decode step: the batch is the running batch (one lookup)
        for r in reqs:
            run, row = r in running, r.req_pool_idx
            derived = (  # DERIVED, in order
                -1 if row is None else row,
                len(r.fill_ids),
                len(r.origin_input_ids),
                len(r.output_ids),
                r.finished_reason is not None,
                r.to_finish is not None,
                r in waiting,
                run,
                run if same else r in batch,
            )
            spec = NO_SPEC if spec_state is None else spec_state(r) or NO_SPEC
            fields = _copied(r) + derived + spec
            view = last.get(r)
            if view != fields:  # a ReqView equals the plain tuple of its fields (None never does)
                view = last[r] = new(ReqView, fields)
            out.append(view)
        if len(last) != len(reqs):  # else its keys are exactly ``reqs``: each one is a key
            self._last = dict(zip(reqs, out))
        return tuple(out)
