"""vLLM's KV-cache groups beyond full + one sliding window, on its real v1 scheduler (0.33.0):
chunked-local attention (Llama 4), MLA's spec, several groups sharing one spec, and groups of
different block sizes (the scheduler aligned to their least common multiple, hashing at their
greatest common divisor) run clean under the census over every group and the null-block rules,
as do EAGLE drafts beside a Mamba group; a chunked-local group that frees blocks of the chunk
still read is caught naming the table position; layouts vLLM refuses are said unsupported
before anything runs. The null-block finding's reproducer (docs/findings) runs with vLLM alone."""

from __future__ import annotations

import ast

import pytest

from invariants.checking.loader import load_catalog
from invariants.scenarios.matrix import ROOT
from invariants.scenarios.ops import Trace
from invariants.scenarios.spec import EngineSpec, KVGroupsSpec, load_spec
from invariants.targets.registry import target
from invariants.targets.run import run_spec
from invariants.targets.vllm import adapter

CATALOG = load_catalog()
VLLM = target("vllm")
SPECS = ROOT / "specs" / "vllm"


def _note(out, prefix: str) -> str:
    return next(n for n in out.notes if n.startswith(prefix)).removeprefix(prefix)


def _clean(spec) -> tuple:
    """``spec`` run on vLLM with no rule firing and every goal met: the outcome, and the
    KV-cache groups as the run built them (the scheduler's block size last)."""
    out = run_spec(VLLM, spec, CATALOG)
    assert out.ok and not out.unmet, (out.error, out.violations[:3], out.unmet)
    return out, _note(out, "kv groups: ").split(", ")


@pytest.mark.vllm
def test_two_chunked_local_groups_run_clean() -> None:
    """Full attention beside two chunked-local groups sharing one spec, under prefix caching,
    async scheduling, preemption and aborts: the layout is built as written, no rule fires."""
    out, layout = _clean(load_spec(SPECS / "chunked-local.yaml"))
    assert layout == [
        "FullAttentionSpec@4",
        "ChunkedLocalAttentionSpec@4",
        "ChunkedLocalAttentionSpec@4",
        "scheduler@4",
    ]
    assert out.stats.preempted and out.stats.aborted and out.stats.cached_tokens


@pytest.mark.vllm
def test_mla_with_sliding_window_groups_of_twice_the_block_size_runs_clean() -> None:
    """MLA's spec for the full group, two sliding-window groups at block size 8 beside it at
    4: the scheduler aligns to 8; prefix hits, EAGLE drafts and preemption, no rule fires."""
    out, layout = _clean(load_spec(SPECS / "mla-uneven-groups.yaml"))
    assert layout == [
        "MLAAttentionSpec@4",
        "SlidingWindowSpec@8",
        "SlidingWindowSpec@8",
        "scheduler@8",
    ]
    assert out.stats.cached_tokens and out.stats.preempted


def _two_full_groups():
    spec = load_spec(ROOT / "specs" / "radix-eviction.yaml")
    two = spec.engine.model_copy(update={"kv_groups": KVGroupsSpec(full_copies=2)})
    return spec.model_copy(update={"engine": two})


@pytest.mark.vllm
def test_two_full_groups_sharing_one_spec_run_clean() -> None:
    """Every group shares one spec (two full-attention groups, no local one: vllm#51888's
    layout) under prefix caching: the groups' hits and evictions agree, no rule fires."""
    out, layout = _clean(_two_full_groups())
    assert layout == ["FullAttentionSpec@1", "FullAttentionSpec@1", "scheduler@1"]
    assert out.stats.cached_tokens and out.stats.evicted_tokens


@pytest.mark.vllm
def test_groups_sharing_one_spec_crash_0_28_at_init_and_not_0_29() -> None:
    """vllm#51888, read from both releases' ``HybridKVCacheCoordinator.verify_and_split_kv_
    cache_groups``: 0.28.0 collapses groups of one spec into one attention group and asserts
    "requires at least two attention groups" — the scheduler cannot be built (the config op
    crashes: ``engine.exception`` keyed by the site); 0.29.0 asserts at least one cacheable
    group and runs clean."""
    from invariants.targets.registry import TargetOptions

    for release in ("0.28.0", "0.29.0"):
        if not adapter.vllm_python(None, release).exists():
            pytest.skip(f"no .vllm-venv-{release}: make vllm-env VLLM_VERSION={release}")
    old = run_spec(VLLM, _two_full_groups(), CATALOG, options=TargetOptions(version="0.28.0"))
    crash = [v for v in old.violations if v.invariant == "engine.exception"]
    assert crash and "requires at least two attention groups" in str(crash[0]), old.violations
    assert old.crash is not None and "verify_and_split_kv_cache_groups" in old.crash.site
    fixed = run_spec(VLLM, _two_full_groups(), CATALOG, options=TargetOptions(version="0.29.0"))
    assert fixed.ok, (fixed.error, fixed.violations[:2])


@pytest.mark.vllm
@pytest.mark.parametrize(("overlap", "version"), [(False, 1), (True, 2)])
def test_eagle_beside_a_mamba_group_runs_clean(overlap: bool, version: int) -> None:
    """EAGLE drafts beside full, sliding-window and Mamba groups (align mode), sync and
    async: the Mamba group keeps its running state and the drafts' states in its table's
    last 1 + num_speculative_blocks blocks, which stay real; no rule fires."""
    spec = load_spec(SPECS / "mamba-hybrid.yaml")
    drafts = {"version": version, "num_steps": 2, "num_draft_tokens": 3, "accept_prob": 0.6}
    engine = spec.engine.model_copy(update={"speculative": drafts, "enable_overlap": overlap})
    out = run_spec(VLLM, spec.model_copy(update={"engine": engine}), CATALOG)
    assert out.error is None and out.violations == (), (out.error, out.violations[:3])
    assert "MambaSpec@4" in _note(out, "kv groups: ") and _note(out, "drafts accepted: ")


@pytest.mark.vllm
def test_a_chunked_local_group_freeing_its_current_chunk_is_caught() -> None:
    """``early_window_free`` on a chunked-local group: two blocks of the chunk the next
    forward reads are nulled and freed; ``vllm.chunk_blocks_held`` names the table position
    the fault reports."""
    spec = load_spec(SPECS / "chunked-local.yaml")
    out = run_spec(VLLM, spec, CATALOG, fault={"kind": "early_window_free", "step": 20})
    (position,) = ast.literal_eval(_note(out, "fault fired on blocks "))
    caught = [v for v in out.violations if v.invariant == "vllm.chunk_blocks_held"]
    assert caught and f"{position}]" in str(caught[0]), (position, out.violations[:2])


def _trace(**engine) -> Trace:
    return Trace(engine=EngineSpec(**engine), ops=[])


@pytest.mark.parametrize(
    ("engine", "reason"),
    [
        (
            dict(
                kv_groups=KVGroupsSpec(chunked_local=32),
                speculative={"version": 1, "num_steps": 2, "num_draft_tokens": 3},
                enable_overlap=False,
            ),
            adapter.CHUNKED_EAGLE,
        ),
        (
            dict(
                kv_groups=KVGroupsSpec(chunked_local=32, local_block_size=8),
                page_size=4,
                swa_tokens=256,
                sliding_window=16,
            ),
            adapter.CHUNKED_UNEVEN,
        ),
        (dict(kv_groups=KVGroupsSpec(local_block_size=8), page_size=4), adapter.LONE_BLOCK_SIZE),
    ],
)
def test_a_layout_vllm_refuses_is_unsupported_naming_it(engine: dict, reason: str) -> None:
    """Chunked-local attention with EAGLE or beside groups of another block size (vLLM's own
    asserts), a local block size with no sliding-window group: unsupported, named."""
    assert adapter.unsupported(_trace(**engine)) == [reason]


def test_the_pool_holds_every_groups_blocks() -> None:
    """vLLM pools all groups' blocks: kvspec's full pool per full group, each local group's
    copies (the SWA pool's size) and each Mamba group's (a full pool)."""
    e = EngineSpec(
        max_total_tokens=512,
        swa_tokens=256,
        sliding_window=16,
        mamba_group=True,
        kv_groups=KVGroupsSpec(chunked_local=32, copies=2, full_copies=2),
    )
    assert adapter.pool_tokens(e) == 2 * 512 + 2 * 2 * 256 + 2 * 512


REPRO = ROOT / "docs" / "findings" / "vllm-null-block-ref-cnt" / "repro.py"


@pytest.mark.vllm
@pytest.mark.parametrize(("release", "observed"), [("0.33.0", False), ("0.32.0", True)])
def test_the_null_block_reproducer_needs_vllm_alone(release: str, observed: bool) -> None:
    """The null-block finding's script, run by a release's python with nothing of kvspec on
    its path: 0.32.0's null block ends at ref_cnt -1 (exit 1), 0.33.0's at 0 (exit 0)."""
    import os
    import subprocess

    python = adapter.vllm_python(None, release)
    if not python.exists():
        pytest.skip(f"no venv for vLLM {release} (make vllm-env VLLM_VERSION={release})")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["VLLM_TARGET_DEVICE"] = "cpu"
    run = subprocess.run([python, REPRO], cwd="/", env=env, capture_output=True, text=True)
    assert run.returncode == int(observed), run.stdout + run.stderr[-2000:]
    assert ("OBSERVED" in run.stdout) == observed, run.stdout
