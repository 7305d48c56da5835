"""A driver for the targets' core tests: the JSON-lines protocol of invariants/targets/driver.py
over a toy engine (requests that finish after their max_new_tokens steps), and, asked by the
config op, the answers a real driver gives when its engine crashes, when it refuses an op (a
step: ``refuse_at``; a request: ``refuse_rid``), when it never becomes idle, or when its pool's
counters stop adding up (``leak_from``: every view from that step on). Its answers are written by
driverlib/wire.py's ``answer_line``, as the vllm driver's are (views after a record separator).
Run by the test interpreter; imports nothing of kvspec but driverlib, as every driver does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[4] / "invariants/targets/driverlib"))
import wire

EMPTY_POOL = {
    "name": "full",
    "page_size": 1,
    "capacity": 4,
    "free": 4,
    "census_input": {"num_pages": 4, "free_pages": [1, 2, 3, 4], "owned": [], "referenced": []},
}


class Engine:
    def __init__(self, cfg: dict) -> None:
        self.cfg, self.steps, self.left = cfg, 0, {}

    def view(self, event: str) -> dict:
        leak = self.steps >= self.cfg.get("leak_from", self.steps + 1)
        pool = dict(EMPTY_POOL, free=3) if leak else EMPTY_POOL  # a page missing from the sums
        return {"event": event, "step": self.steps, "page_size": 1, "pools": [pool]}

    def answer(self, op: dict) -> dict:
        kind, cfg = op["op"], self.cfg
        if kind == "submit":
            if op["rid"] == cfg.get("refuse_rid"):
                return {"error": f"ValueError: {op['rid']} is too long", "drift": False}
            self.left[op["rid"]] = op["max_new_tokens"]
            return {"views": [], "result": None}
        if kind == "step":
            self.steps += 1
            if self.steps == cfg.get("crash_at"):
                return crash("AssertionError", "slot taken", "fake_engine/sched.py", "take", 7)
            if self.steps == cfg.get("refuse_at"):
                return {"error": "KeyError: 'rid'", "drift": False}
            self.left = {rid: n - 1 for rid, n in self.left.items() if n > 1}
            return {"views": [self.view("step")], "result": None, "findings": cfg.get("says", [])}
        if kind == "idle":
            idle = not self.left and not cfg.get("never_idle")
            return {"views": [self.view("idle")] if idle else [], "result": idle}
        if kind == "unfinished":
            return {"views": [], "result": [r for r in op["rids"] if r in self.left]}
        if kind == "stats":
            return {"views": [], "result": {"counts": {"steps": self.steps, "finished": 0}}}
        return {"views": [], "result": None}


def crash(error: str, message: str, path: str, function: str, line: int) -> dict:
    site, where = f"{path}:{function}", f"{path}:{line}"
    return {
        "error": f"{error}: {message} [raised at {where} in {function}]",
        "drift": False,
        "crash": {"error": error, "message": message, "site": site, "line": where},
    }


def main() -> None:
    say = sys.stdout
    if "--drift" in sys.argv:
        say.write(
            json.dumps(
                {
                    "ready": False,
                    "drift": True,
                    "version": "9.9",
                    "error": "AttributeError: no attribute 'recv_requests'",
                }
            )
            + "\n"
        )
        return
    if "--die" in sys.argv:
        sys.stderr.write("ImportError: no module named fake_engine\n")
        sys.exit(3)
    say.write(json.dumps({"ready": True, "version": "1.0", "not_applicable": {}}) + "\n")
    say.flush()
    engine = None
    for line in sys.stdin:
        op = json.loads(line)
        if op["op"] == "config":
            engine, answer = Engine(op), {"views": [], "result": {}}
        else:
            answer = engine.answer(op)
        say.write(wire.answer_line(answer) + "\n")
        say.flush()


if __name__ == "__main__":
    main()
