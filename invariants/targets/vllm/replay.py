"""`kvspec replay TRACE --target vllm`: a trace on vLLM's real scheduler to its first finding,
with the op it came in and the state-view diff from the last step before it.

Keeps: the replay runs the trace exactly as the explorer checked it (same catalog, level 2, a
fresh Scheduler from the config op), so a shrunk failure reproduces with the same key.
"""

from __future__ import annotations

from dataclasses import dataclass

from invariants.checking.loader import shipped_catalog
from invariants.explore.real import failure_key
from invariants.explore.replay import first_violation_diff
from invariants.scenarios.ops import Trace, op_label
from invariants.targets.sglang.run import SGLangOutcome
from invariants.targets.vllm.run import run_trace_on_vllm


@dataclass(frozen=True, slots=True)
class VLLMReplay:
    trace: Trace
    outcome: SGLangOutcome

    @property
    def failure(self) -> str | None:
        return failure_key(self.outcome)

    def describe(self) -> list[str]:
        out, ops = self.outcome, self.trace.ops
        head = f"vLLM {out.sglang_version} (real scheduler), {out.stats.steps} steps"
        if self.failure is None:
            return [f"{head}: no finding ({len(ops)} ops, idle reached)"]
        at = out.stopped_at
        where = "the drain after the last op" if at is None or at >= len(ops) else (
            f"op #{at} ({op_label(ops[at])})"
        )  # fmt: skip
        lines = [f"{head}: {self.failure}", f"  in {where}"]
        if out.violations:
            v = out.violations[0]
            lines += [str(v), f"  title: {v.title}", *(f"  witness: {w}" for w in v.witnesses)]
        if out.error:
            lines.append(f"  error: {out.error}")
        return lines + first_violation_diff(out.views, bool(out.violations))


def replay_on_vllm(trace: Trace, python: str | None = None) -> VLLMReplay:
    outcome = run_trace_on_vllm(trace, shipped_catalog(), 2, python, keep_views=True)
    return VLLMReplay(trace, outcome)
