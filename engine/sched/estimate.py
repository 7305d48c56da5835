"""What the scheduler estimated an iteration's batch would allocate, and what preparing the
batch then took from each pool.

SGLang decides on estimates and allocates after: a prefill admits a request when its
page-ceiled extend plus a page of slack fits (``PrefillAdder``), a decode step runs when
``new_page_count_next_decode`` × page size fits (``check_decode_mem``). An estimate short of
what the allocation then takes — one page at an exact page boundary, as TensorRT-LLM's
reuse-aware scheduler once was — runs the pool dry with nothing said until an allocation
fails, or lets a step take memory the admission promised to another. The ledger keeps both
sides so that a rule (``sched.allocation_within_estimate``) compares them at the step.

Keeps: ``estimated`` is what the batch was decided on since ``begin``: the adder's charges
for the admitted prompts plus the last decode check that passed (the one the decode step,
or a mixed batch's decode part, runs on; a retract re-checks the smaller batch);
``allocated`` is, per pool, the tokens the pools' allocators handed out since ``begin``
(their ``taken_tokens`` counters: every page taken, whoever took it).
"""

from __future__ import annotations

from engine.memory import KVMemory


class AllocEstimate:
    """One iteration's estimate and allocation (``begin`` at the iteration's start)."""

    __slots__ = ("_start", "decode", "mem", "prefill")

    def __init__(self, mem: KVMemory) -> None:
        self.mem = mem
        self.begin()

    def begin(self) -> None:
        self.prefill = self.decode = 0  # the adder's charges; the passing decode check's need
        self._start = self.mem.taken_tokens()

    @property
    def estimated(self) -> int:
        return self.prefill + self.decode

    def allocated(self) -> tuple[int, ...]:
        """Per pool (full, then SWA), the tokens taken since ``begin``."""
        return tuple(now - then for now, then in zip(self.mem.taken_tokens(), self._start))
