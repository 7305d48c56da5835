"""Seeded request traces: the anchor workload (invariants/bench/anchor.py), scalable.

Keeps: a trace is a pure function of (seed, shape) — the same seed gives the same requests,
so a failure replays and kvspec's numbers compare with real SGLang's on the same trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class TraceShape:
    """Shape of a trace. Defaults are the anchor benchmark's (vocab 32000, 8 × 256-token
    system prompts, user suffix U[32, 512], generation U[16, 64])."""

    vocab: int = 32000
    num_system_prompts: int = 8
    system_prompt_len: int = 256
    suffix_min: int = 32
    suffix_max: int = 512
    gen_min: int = 16
    gen_max: int = 64

    @property
    def max_context(self) -> int:
        return self.system_prompt_len + self.suffix_max + self.gen_max + 64

    def scaled(self, factor: int) -> TraceShape:
        """A proportionally shorter trace (every length divided by ``factor``), for fast checks."""
        f = max(1, factor)
        return TraceShape(
            self.vocab,
            self.num_system_prompts,
            max(1, self.system_prompt_len // f),
            max(1, self.suffix_min // f),
            max(1, self.suffix_max // f),
            max(1, self.gen_min // f),
            max(1, self.gen_max // f),
        )


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: prompt ids, generation length, the tokens it will generate."""

    rid: str
    input_ids: tuple[int, ...]
    max_new_tokens: int
    output_ids: tuple[int, ...]


def make_trace(
    seed: int, num_requests: int, shape: TraceShape = TraceShape()
) -> list[TraceRequest]:
    """``num_requests`` requests drawn exactly as the anchor benchmark draws them."""
    rng = np.random.default_rng(seed)
    prompts = [
        rng.integers(1, shape.vocab, shape.system_prompt_len).tolist()
        for _ in range(shape.num_system_prompts)
    ]
    trace = []
    for i in range(num_requests):
        system = int(rng.integers(0, shape.num_system_prompts))
        suffix = int(rng.integers(shape.suffix_min, shape.suffix_max + 1))
        gen = int(rng.integers(shape.gen_min, shape.gen_max + 1))
        ids = prompts[system] + rng.integers(1, shape.vocab, suffix).tolist()
        outs = rng.integers(1, shape.vocab, gen).tolist()
        trace.append(TraceRequest(f"r{i}", tuple(ids), gen, tuple(outs)))
    return trace
