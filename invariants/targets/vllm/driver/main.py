"""The vllm target's subprocess: vLLM v1's real Scheduler and KVCacheManager on CPU, driven by
JSON lines (ops in, views out). Run by the vllm venv's python; imports nothing of kvspec.

Only the model runner is faked: each scheduled request that reaches the end of its known
tokens samples its next token from the op's seeded ``output_ids`` (a partial prefill chunk
samples nothing, as the GPU runner discards it; ``eos_prob`` makes it EOS now and then, never
before the request's ``min_new_tokens`` — vLLM's ``min_tokens``, which its sampler enforces),
which ends a request that does not ignore EOS; with ``num_speculative_tokens`` each step
also proposes drafts and a verify accepts a seeded prefix of them (spec.py; under async
scheduling vLLM puts placeholders where the drafts go and the runner fills them); with a
``connector`` the runner's output also reports the seeded connector's transfers. Under
``async_scheduling`` (the AsyncScheduler) a step's output is processed after the next step
is scheduled, as vLLM's engine core does and its tests drive it: one step is always in
flight (what it reads goes into the view: in_flight.py). The engine is idle once vLLM's
``has_requests()`` is false and nothing is in flight. Protocol, one line each way per op:

  in:  {"op": "config", "block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens",
        "max_model_len", "prefix_caching", "sliding_window": null | W, "async_scheduling",
        "num_speculative_tokens", "accept_prob", "eos_prob", "connector": null | {"role",
        "seed", rates, "max_delay"} (connector.py), "fault": null | {"kind", "step"},
        "views"?: false}
       {"op": "submit", "rid", "input_ids", "max_new_tokens", "output_ids", "ignore_eos",
        "min_new_tokens"}
       {"op": "abort", "rid"} | {"op": "abort", "rid": null, "phase", "pick"}
       {"op": "step"}  {"op": "idle"}  {"op": "unfinished", "rids"}  {"op": "stats"}
       {"op": "flush_cache"} (vLLM's reset_prefix_cache: only when no request holds a block)
       {"op": "replay", "ops", "runs"} (between runs: what viewing costs this process alone)
  out: {"views": [...], "result": ...} or {"error", "drift", "crash"?, "where"?, "trace"}
       (driverlib/answers.py); the first line is a banner {"ready": true, "version": VERSION}.
       ``idle`` answers whether the scheduler is idle (its view the idle event's), as does
       ``step`` ({"idle": bool}: whether it left the engine idle);
       ``stats`` answers {"counts", "scheduler", "drafts", "connector", "owners", "groups",
       "fault", "fault_fired"} (``owners``: the kinds of block owner the views listed, with
       a connector; ``groups``: each KV-cache group's spec and block size, the scheduler's).
A view is what the driver read of the scheduler (views.py): the block pool as what changed
since the run's previous view (pool_reads.py: kvspec's side derives the block records, the
pool's counters and the census input from it), and each request's block table per KV-cache
group.
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the CUDA wheel cannot infer a device
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
HERE = os.path.dirname(os.path.abspath(__file__))
DRIVERLIB = os.path.normpath(os.path.join(HERE, "..", "..", "driverlib"))
sys.path[:0] = [HERE, DRIVERLIB]
# the protocol owns stdout: whatever vLLM or its imports print goes to stderr instead
PROTOCOL = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

import answers  # noqa: E402
import faults  # noqa: E402
import in_flight  # noqa: E402
import pool_reads  # noqa: E402
import spec  # noqa: E402
import views  # noqa: E402
import vllm  # noqa: E402
import wire  # noqa: E402
import writes  # noqa: E402
from stack import (  # noqa: E402
    EOS_TOKEN_ID,
    build_scheduler,
    instrument,
    make_request,
    watch_preemptions,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402


class Driver:
    """One scheduler and the state kvspec's ops need around it."""

    def __init__(self, model_dir: str | None = None) -> None:
        self.sched = None
        self.result = None
        # what ``stats`` reads, before any config op succeeded (its error is the answer)
        self.counts: dict[str, int] = {}
        self.fault = self.spec = self.connector = None
        self.owners: set[str] = set()
        self.model_dir = model_dir or tempfile.mkdtemp(prefix="kvspec-vllm-model-")

    def config(self, op: dict) -> list[dict]:
        """A fresh scheduler and fresh bookkeeping: every run starts here."""
        writes.stop()  # (the last run's recording: vLLM's building of the pool is not a write)
        self.outputs: dict[str, list[int]] = {}
        self.order: list[str] = []  # rids in submit order (phase aborts pick from it)
        self.counts = dict.fromkeys(
            (
                "steps",
                "finished",
                "aborted",
                "rejected",
                "preempted",
                "cached_tokens",
                "evicted_tokens",
                "decode_tokens",
            ),
            0,
        )
        self.sched = None  # (a scheduler that cannot be built leaves none behind)
        self.sched = build_scheduler(op, self.model_dir)
        self.block_size, self.max_model_len = op["block_size"], op["max_model_len"]
        instrument(self.sched, self.counts, self.block_size)
        # requests hash their tokens in blocks of this size (groups of different block sizes:
        # their greatest common divisor, as vLLM's engine core resolves it)
        self.hash_size = getattr(self.sched, "hash_block_size", None) or self.block_size
        self.connector = self.sched.connector  # the seeded connector (connector.py) or None
        self.owners: set[str] = set()  # the kinds of block owner the views have listed
        self.unfreed: list[str] = []  # this step's preemptions that freed nothing at once
        watch_preemptions(self.sched, self.unfreed)
        self.fault = faults.install(op.get("fault"), self.sched)
        self.viewing = op.get("views", True)  # False: the scheduler alone (its speed, unchecked)
        self.inflight = None  # async: the scheduled step whose output is not processed yet
        self.asynchronous = bool(op.get("async_scheduling"))
        self.eos_prob = op.get("eos_prob", 0.0)
        # views are deltas: the pool's reads as last sent (a run that views records vLLM's
        # writes from here on)
        self.reads = pool_reads.PoolReads(writes.record() if self.viewing else None)
        k = op.get("num_speculative_tokens") or 0
        self.spec = spec.Speculation(k, op.get("accept_prob", 0.7)) if k else None
        return self._view("step")

    def submit(self, op: dict) -> list[dict]:
        rid = op["rid"]
        if len(op["input_ids"]) >= self.max_model_len:  # vLLM's input processor refuses it
            self.counts["rejected"] += 1
            return []
        self.outputs[rid] = list(op["output_ids"])
        self.order.append(rid)
        ignore_eos = op.get("ignore_eos", True)
        request = make_request(
            rid,
            op["input_ids"],
            op["max_new_tokens"],
            ignore_eos,
            self.hash_size,
            op.get("min_new_tokens", 0),
        )
        self.sched.add_request(request)
        return []

    def abort(self, op: dict) -> list[dict]:
        rid = op.get("rid") or self._pick(op.get("phase", "any"), op.get("pick", 0))
        self.result = rid
        if rid is None or rid not in self.sched.requests:
            return []
        self.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        self.counts["aborted"] += 1
        return self._view("step")

    def _view(self, event: str) -> list[dict]:
        if not self.viewing:
            return []
        step, size = self.counts["steps"], self.block_size
        reads = self.inflight[2] if self.inflight else []
        view = views.state(self.sched, event, step, size, self.reads, reads)
        if self.connector is not None:  # transfer and deferred owners exist only with one
            owners = view["pool"]["kinds"] or {}
            self.owners.update(["cache", *owners.values()])
            self.owners.update(label.split(":")[0] for label in view["pool"]["fenced"])
        view["sched"] = {"preempted_unfreed": list(self.unfreed)}
        self.unfreed.clear()  # each preemption is reported by the view after it, once
        return [view]

    def _pick(self, phase: str, pick: int) -> str | None:
        live = [r for r in self.order if r in self.sched.requests]
        running = {r.request_id for r in self.sched.running}
        chosen = {
            "waiting": [r for r in live if r not in running],
            "running": [r for r in live if r in running],
            "chunked": [
                r for r in live if r in running and self.sched.requests[r].is_prefill_chunk
            ],
        }.get(phase, live)
        return chosen[pick % len(chosen)] if chosen else None

    def step(self, op: dict) -> list[dict]:
        step = self.counts["steps"] = self.counts["steps"] + 1
        if self.fault is not None:
            self.fault.at_step(step)
        if self.connector is not None:
            self.connector.now = step
        if self.asynchronous and not self.sched.has_requests():  # the engine core's batch
            done, self.inflight = self.inflight, None  # queue drains: nothing new to schedule
            if done is not None:
                self.sched.update_from_output(*done[:2])
        else:
            self._run(step)
        self._count_finished()
        self.result = {"idle": self._idle()}  # (the drain asks no idle query while busy)
        return self._view("step")

    def _run(self, step: int) -> None:
        """Schedule a step and process an output: this one's, or (async) the one before."""
        out = self.sched.schedule()
        self.counts["preempted"] += len(getattr(out, "preempted_req_ids", ()) or ())
        done = (out, self._sampled(out, step))  # what the runner reports is fixed at schedule
        if self.asynchronous:
            done, self.inflight = self.inflight, self._in_flight(out, done)
        if done is not None:
            self.sched.update_from_output(*done[:2])
        if self.spec is not None and not self.asynchronous:
            drafts = self.spec.proposals(self.sched, list(out.num_scheduled_tokens), self._token)
            self.sched.update_draft_token_ids(drafts)

    def _in_flight(self, out, done: tuple) -> tuple | None:
        """The step now in flight (async): its output and what it reads, or None for a step
        that scheduled nothing (with a connector it still goes through: its output carries
        the transfers the workers report, as vLLM's engine core queues every step)."""
        if not out.total_num_scheduled_tokens and self.connector is None:
            return None
        if not self.viewing:  # what it reads is read for the views alone
            return (*done, [])
        k = self.spec.k if self.spec is not None else 0
        return (*done, in_flight.step_reads(self.sched, out.num_scheduled_tokens, k))

    def _token(self, rid: str, ahead: int = 0) -> int:
        """The seeded output token ``ahead`` places past what ``rid`` has output: EOS with
        the spec's ``eos_prob`` (a coin seeded by rid and position) once ``min_tokens`` are
        out (vLLM's sampler masks it before: MinTokensLogitsProcessor), else the trace's."""
        request = self.sched.requests[rid]
        tokens, at = self.outputs[rid], request.num_output_tokens + ahead
        eos_allowed = self.eos_prob and at >= request.sampling_params.min_tokens
        if eos_allowed and random.Random(f"{rid}:eos:{at}").random() < self.eos_prob:
            return EOS_TOKEN_ID
        return tokens[at % len(tokens)]

    def _sampled(self, out, step: int) -> ModelRunnerOutput:
        """One token per request whose chunk reaches the end of its known tokens; a verify
        of scheduled drafts samples the accepted ones and the bonus; the connector's
        transfers due in this step."""
        rids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in rids:
            req, drafts = self.sched.requests[rid], out.scheduled_spec_decode_tokens.get(rid)
            if req.is_prefill_chunk:
                sampled.append([])
            elif drafts:
                if self.asynchronous:  # placeholders: the proposer's tokens are the seeded ones
                    drafts = [self._token(rid, j) for j in range(len(drafts))]
                sampled.append(self.spec.verified(req, list(drafts), self._token(rid)))
            else:
                sampled.append([self._token(rid)])
        self.counts["decode_tokens"] += sum(map(len, sampled))  # the tokens the runner sampled
        return ModelRunnerOutput(
            req_ids=rids,
            req_id_to_index={r: i for i, r in enumerate(rids)},
            sampled_token_ids=sampled,
            kv_connector_output=self.connector.output(step) if self.connector else None,
        )

    def _count_finished(self) -> None:
        gone = [r for r in self.order if r not in self.sched.requests and r in self.outputs]
        for rid in gone:
            del self.outputs[rid]
            self.counts["finished"] += 1

    def idle(self, op: dict) -> list[dict]:
        self.result = self._idle()
        return self._view("idle") if self.result else []

    def _idle(self) -> bool:
        """vLLM's engine core steps while has_requests(): unfinished requests, finished ones
        not yet drained (their ids, blocks a connector still sends), connector push work; and
        while a step is in flight."""
        return not self.sched.has_requests() and self.inflight is None

    def flush_cache(self, op: dict) -> list[dict]:
        """``Scheduler.reset_prefix_cache()``: refused (False) while a request holds blocks,
        as SGLang's flush_cache is; on success every hash is dropped and every block free."""
        self.result = bool(self.sched.reset_prefix_cache())
        return self._view("step")

    def unfinished(self, op: dict) -> list[dict]:
        self.result = [r for r in op["rids"] if r in self.sched.requests]
        return []

    def stats(self, op: dict) -> list[dict]:
        finished = self.counts["finished"] - self.counts["aborted"]
        self.result = {
            "counts": {**self.counts, "finished": max(finished, 0)},
            "fault": self.fault is not None,
            "fault_fired": self.fault.fired if self.fault else [],
            "scheduler": type(self.sched).__name__,
            "drafts": [self.spec.accepted_drafts, self.spec.verified_drafts] if self.spec else None,
            "connector": self.connector.counts if self.connector is not None else None,
            "owners": sorted(self.owners),
            "groups": views.group_layout(self.sched) if self.sched is not None else [],
        }
        return []

    def replay(self, op: dict) -> list[dict]:
        """What viewing costs this process alone (``kvspec bench target --replay``): the ops of
        one run (``ops``), replayed ``runs`` times by fresh drivers with views off and on in
        turn, each answer encoded as it would be sent; the CPU seconds of each replay but its
        config ops (process time: neither the pipe, nor kvspec's side, nor a busy VM's other
        tenants), and the last op's result (a replay is the run again: the same stats). Between
        runs only: it leaves the write hooks off (a run's config sets them)."""
        times: dict[str, list] = {"unviewed_s": [], "viewed_s": []}
        for _ in range(op["runs"]):
            for viewing, key in ((False, "unviewed_s"), (True, "viewed_s")):
                spent, last = self._replayed(op["ops"], viewing)
                times[key].append(spent)
        writes.stop()
        self.result = times | {"last": last}
        return []

    def _replayed(self, ops: list[dict], viewing: bool) -> tuple[float, object]:
        replica, spent = Driver(self.model_dir), 0.0
        for op in ops:
            if op["op"] == "config":
                replica.config(dict(op, views=viewing))
                continue
            start, replica.result = time.process_time(), None
            produced = getattr(replica, op["op"])(op)
            wire.answer_line({"views": produced, "result": replica.result})
            spent += time.process_time() - start
        return spent, replica.result


def main() -> None:
    driver = Driver()
    gc.freeze()  # the start-up heap (vLLM, torch) is never collected: vLLM's EngineCore does so
    gc.set_threshold(20_000, *gc.get_threshold()[1:])  # a view allocates reads by the hundred
    print(wire.line({"ready": True, "version": vllm.__version__}), file=PROTOCOL, flush=True)
    for line in sys.stdin:
        op = json.loads(line)
        driver.result = None
        try:
            produced = getattr(driver, op["op"])(op)
            answer = {"views": produced, "result": driver.result}
        except Exception as exc:  # the op's failure is the answer; the driver goes on
            answer = answers.failure(exc, (HERE, DRIVERLIB), "vllm")
        print(wire.answer_line(answer), file=PROTOCOL, flush=True)


if __name__ == "__main__":
    main()
