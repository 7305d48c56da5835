"""The sglang target's subprocess: JSON lines in (ops), JSON lines out (views).

Run by the sglang venv's python (``python main.py``); imports nothing of kvspec. Protocol,
one line each way per op:

  in:  {"op": "config", "page_size", "pool_tokens", "swa_tokens"?, "sliding_window"?, "max_reqs",
        "max_context", "batch", "max_prefill_tokens", "max_input_len", "bos_id",
        "fault": null | {"kind": "skip_free" | "double_free", "step": N}}
       {"op": "submit", "rid", "input_ids", "max_new_tokens", "output_ids", "session"?: {"id",
        "rid", "offset", "replace", "drop_previous_output"}, "return_logprob", "logprob_start_len"}
       {"op": "open_session", "session_id", "streaming", "timeout"}
       {"op": "close_session", "session_id"}
       {"op": "abort", "rid"} | {"op": "abort", "phase", "pick"}
       {"op": "advance_clock", "seconds"}
       {"op": "step"}   {"op": "idle"}   {"op": "unfinished", "rids"}   {"op": "stats"}
  out: {"views": [...], "result": ..., "faults": [...]} or {"error", "drift", "crash"?,
       "where"?, "trace"} (driverlib/answers.py); the first line is a banner {"ready": true,
       "version": VERSION, "stubs": [...]}. ``idle`` answers whether the glue is idle (its view
       the idle event's); ``stats`` answers {"counts"}.
"""

from __future__ import annotations

import json
import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVERLIB = os.path.normpath(os.path.join(HERE, "..", "..", "driverlib"))
sys.path[:0] = [HERE, DRIVERLIB]
import stubs  # noqa: E402

INSTALLED = stubs.install()
logging.disable(logging.WARNING)

import answers  # noqa: E402
import glue as glue_mod  # noqa: E402
import sglang  # noqa: E402
import stack as stack_mod  # noqa: E402
import state  # noqa: E402
from sglang.srt.runtime_context import get_parallel, publish, reset_context  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402


class Driver:
    """Holds one Glue; applies ops; answers each with the views it produced."""

    def __init__(self) -> None:
        self.glue: glue_mod.Glue | None = None
        self.faults: list[dict] = []  # what the injected fault did (slot ids)

    def config(self, op: dict) -> list[dict]:
        reset_context()
        publish(
            ServerArgs(model_path="dummy", device="cpu", attention_backend="torch_native"),
            role="scheduler",
        )
        get_parallel().override_permanently(tp_rank=0)  # one rank (set_finish_with_abort reads it)
        stack = stack_mod.Stack(
            op["page_size"],
            op["pool_tokens"],
            op["max_reqs"],
            op["max_context"],
            op.get("swa_tokens"),
            op.get("sliding_window"),
        )
        self.glue = glue_mod.Glue(
            stack,
            op["batch"],
            op.get("max_prefill_tokens", 16384),
            op.get("max_input_len", op["max_context"]),
            op.get("bos_id"),
        )
        self.faults = []
        if op.get("fault"):
            self._inject(stack, op["fault"]["kind"], op["fault"]["step"])
        return []

    def _inject(self, stack, kind: str, at_step: int) -> None:
        """Patch the REAL allocator: from step ``at_step`` on, its first non-empty free is
        skipped (a leak) or done twice (a double free); the slot ids are reported."""
        if kind not in ("skip_free", "double_free"):
            raise ValueError(f"unknown fault {kind!r} (skip_free | double_free)")
        real_free, glue = stack.alloc.free, self.glue

        def faulty_free(free_index):
            if self.faults or glue.counts["steps"] + 1 < at_step or not len(free_index):
                return real_free(free_index)
            self.faults.append(
                dict(
                    kind=kind,
                    step=glue.counts["steps"] + 1,
                    slots=sorted(int(x) for x in free_index.tolist()),
                )
            )
            if kind == "double_free":
                real_free(free_index)
                real_free(free_index.clone())

        stack.alloc.free = faulty_free

    def apply(self, op: dict) -> tuple[list[dict], object]:
        """The views ``op`` produced and its result (an op's own answer, or None)."""
        kind = op.get("op")
        if kind == "config":
            return self.config(op), None
        if self.glue is None:
            raise ValueError(f"op {kind!r} before config")
        glue = self.glue
        if kind == "submit":
            glue.submit(op)
            return [], None
        if kind == "open_session":
            ok = glue.open_session(op["session_id"], op.get("streaming", True), op.get("timeout"))
            return [state.view(glue, "session")], ok
        if kind == "close_session":
            return [state.view(glue, "session")], glue.close_session(op["session_id"])
        if kind == "abort":
            rid = op.get("rid")
            if rid is None:
                picks = glue.unfinished(op.get("phase", "any"))
                rid = picks[op.get("pick", 0) % len(picks)] if picks else None
            return [], (rid if rid is not None and glue.abort(rid) else None)
        if kind == "step":
            glue.step(op.get("plan"))
            return [state.view(glue, "step")], None
        if kind == "advance_clock":
            glue.now += op["seconds"]
            return [], None
        if kind == "unfinished":
            return [], [rid for rid in op["rids"] if not glue.finished(rid)]
        if kind == "idle":
            return ([state.view(glue, "idle")] if glue.idle else []), glue.idle
        if kind == "stats":
            return [], dict(counts=dict(glue.counts, evicted_tokens=glue.stack.evicted_tokens))
        raise ValueError(f"unknown op {kind!r}")


def main() -> None:
    out = sys.stdout
    out.write(json.dumps(dict(ready=True, version=sglang.__version__, stubs=INSTALLED)) + "\n")
    out.flush()
    driver = Driver()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            views, result = driver.apply(json.loads(line))
            answer = dict(views=views, result=result, faults=driver.faults)
        except Exception as exc:  # reported to the harness, which names the op
            answer = answers.failure(exc, (HERE, DRIVERLIB), "sglang")
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
