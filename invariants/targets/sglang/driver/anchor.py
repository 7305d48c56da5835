"""The performance anchor: SGLang's REAL KV-cache memory path on CPU (no model), timed on the
seeded anchor workload (anchor_run.py), one JSON document on stdout. Run by the sglang venv's
python (`kvspec bench anchor --target sglang` runs it); imports nothing of kvspec.

Keeps: each cell (page size × batch) runs the same trace ``warmup + runs`` times on a fresh
stack, unchecked, then with SGLang's busy check after every step, then with its page-invariant
check; the checks are timed apart from the steps. Negative controls prove both checks can fire
(a leaked page, a use-after-free): otherwise their times would measure a no-op.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import stubs  # noqa: E402

STUBS = stubs.install()
logging.disable(logging.WARNING)

import sglang  # noqa: E402
import torch  # noqa: E402
from anchor_run import AnchorRun, Stack, make_reqs, make_trace, pool_tokens  # noqa: E402
from sglang.srt.runtime_context import publish, reset_context  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

PHASES = {"speed": (), "conserv": ("conserv",), "page": ("page",)}
SAME = (
    "steps_total",
    "steps_timed",
    "prefills",
    "finishes",
    "hit_tokens",
    "extend_tokens",
    "evict_calls",
    "evicted_tokens",
)


def spread(xs: list[float]) -> dict:
    xs, mid = sorted(xs), statistics.median(xs)
    pct = round(100.0 * (xs[-1] - xs[0]) / mid, 1) if mid else None
    return dict(median=round(mid, 3), min=round(xs[0], 3), max=round(xs[-1], 3), spread_pct=pct)


def runs_of(args, cache: str, ps: int, batch: int, checks: tuple, trace: list) -> list[dict]:
    """The timed runs of one cell and phase (the warm-up runs dropped)."""
    found = []
    for k in range(args.warmup + args.runs):
        st = Stack(cache, ps, batch, pool_tokens(batch))
        reqs = make_reqs(trace)
        gc.collect()
        result = AnchorRun(st, reqs, batch, checks=checks).run()
        if k >= args.warmup:
            found.append(result)
    return found


def cell(args, ps: int, batch: int) -> dict:
    """One page size × batch: speed, then each check interleaved, as one row."""
    n = int(max(args.min_requests, args.req_factor * batch))
    trace = make_trace(args.seed, n)
    phases = {"speed": ()} if args.no_checks else PHASES
    by_phase = {name: runs_of(args, args.cache, ps, batch, c, trace) for name, c in phases.items()}
    runs = by_phase["speed"]
    first = {k: runs[0][k] for k in SAME}
    same = all({k: r[k] for k in SAME} == first for rs in by_phase.values() for r in rs)
    prefill = statistics.median(r["pct_prefill"] for r in runs)
    decode = statistics.median(r["pct_decode_alloc"] for r in runs)
    row = dict(
        page_size=ps,
        batch=batch,
        requests=n,
        pool_tokens=pool_tokens(batch),
        steps_per_s=spread([r["steps_per_s"] for r in runs]),
        decode_token_slots_per_s_median=round(
            statistics.median(r["decode_tokens_per_s"] for r in runs), 1
        ),
        mean_batch_in_window=round(runs[0]["mean_batch"], 2),
        time_split_pct_median=dict(
            admit_match_lock_extend_checkpoint=round(prefill, 1),
            decode_alloc=round(decode, 1),
            finish_release_and_glue=round(100 - prefill - decode, 1),
        ),
        **first,
        trace_identical_across_runs=same,
    )
    return row if args.no_checks else {**row, **check_fields(by_phase)}


def check_fields(by_phase: dict) -> dict:
    """What each check costs per step, and the steps/s with it interleaved."""
    return dict(
        conservation_check_us_per_step=spread(
            [r["conserv_us_per_step"] for r in by_phase["conserv"]]
        ),
        page_invariant_check_us_per_step=spread([r["page_us_per_step"] for r in by_phase["page"]]),
        steps_per_s_with_check_interleaved=dict(
            conservation=round(statistics.median(r["steps_per_s"] for r in by_phase["conserv"]), 1),
            page=round(statistics.median(r["steps_per_s"] for r in by_phase["page"]), 1),
        ),
        checks_passed_every_step=True,  # they raise otherwise
    )


def negative_controls(cache: str, ps: int) -> dict:
    """Both checks fire on planted bugs (a page taken from the allocator and owned by nobody;
    a running request's last page freed under it)."""
    batch, trace = 8, make_trace(1, 24)

    def leak(step, st, running):
        if step == 30:
            st.alloc.alloc(st.page_size)

    def use_after_free(step, st, running):
        if step == 30 and running:
            req = running[0]
            loc = st.rpool.req_to_token[req.kv.req_pool_idx, req.kv.kv_allocated_len - 1]
            st.alloc.free(loc.reshape(1).to(torch.int64))

    found = {}
    for name, fault, checks in (
        ("leak_caught_by_conservation", leak, ("conserv",)),
        ("use_after_free_caught_by_conservation", use_after_free, ("conserv",)),
        ("use_after_free_caught_by_page_check", use_after_free, ("page",)),
    ):
        st = Stack(cache, ps, batch, pool_tokens(batch))
        try:
            AnchorRun(st, make_reqs(trace), batch, checks=checks, inject=fault).run()
            found[name] = False
        except (AssertionError, ValueError):
            found[name] = True
    return found


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--page-sizes", default="1,16")
    ap.add_argument("--batches", default="8,32,128")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--req-factor", type=float, default=10.0, help="N = max(min, factor * B)")
    ap.add_argument("--min-requests", type=int, default=384)
    ap.add_argument("--cache", choices=("unified", "radix"), default="unified")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--no-checks", action="store_true")
    return ap.parse_args()


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    reset_context()
    publish(
        ServerArgs(model_path="dummy", device="cpu", attention_backend="torch_native"),
        role="scheduler",
    )
    began, load = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    sizes = [int(x) for x in args.page_sizes.split(",")]
    results = [cell(args, ps, int(b)) for ps in sizes for b in args.batches.split(",")]
    controls = None
    if not args.no_checks:
        controls = {f"page_size_{ps}": negative_controls(args.cache, ps) for ps in sizes}
    out = dict(
        **facts(args, sizes[0], load),
        results=results,
        negative_controls=controls,
        wall_s=round(time.perf_counter() - began, 1),
    )
    json.dump(out, sys.stdout, indent=1)
    print()


def facts(args: argparse.Namespace, page_size: int, load: list[float]) -> dict:
    """What ran, on what: the release, the cache, the machine, the workload."""
    unified = "UnifiedRadixCache(tree_components=(FULL,))"
    return dict(
        sglang_version=sglang.__version__,
        torch_version=torch.__version__,
        python=platform.python_version(),
        cache_class=unified if args.cache == "unified" else "RadixCache",
        tree_core=Stack(args.cache, page_size, 8, pool_tokens(8)).tree_core,
        stubs=STUBS,
        machine=dict(
            cpus=os.cpu_count(),
            torch_threads=torch.get_num_threads(),
            processor=platform.processor() or platform.machine(),
            loadavg_start=load,
            loadavg_end=[round(x, 2) for x in os.getloadavg()],
        ),
        workload=dict(
            seed=args.seed,
            runs=args.runs,
            warmup=args.warmup,
            requests=f"max({args.min_requests}, {args.req_factor:g}*B)",
        ),
    )


if __name__ == "__main__":
    main()
