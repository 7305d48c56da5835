"""The probes (probes.py) asked of the installed SGLang, once its stubs are in: which adapter
drives it (``adapter_legacy``, ``adapter_components`` or ``adapter_context``, by the era's two
probes), and what the answers mean for the banner — the catalog ids the release's design does
not promise, the engine features beyond the plain ones it drives.

Keeps: every answer comes from the code (an import, an attribute, a signature, a dataclass's
fields), never from ``sglang.__version__``; an internal no adapter drives is ``Drift`` naming
it and the adapter the era chose. Runs inside the sglang venv; imports nothing of kvspec.
"""

from __future__ import annotations

import importlib

import probes
from probes import CHECKER, SESSION_MODULES, SLOT_MODULES, SRT, Drift, Found, Probes

# the era (how the Scheduler starts, where its seams are) -> the adapter module that drives it
ADAPTERS = {
    ("gloo", "scheduler"): "adapter_legacy",
    ("gloo", "components"): "adapter_components",
    ("context", "components"): "adapter_context",
}

ROW_ZERO = {
    "req_pool.row_zero_reserved": "this release's ReqToTokenPool hands out row 0 "
    "(free_slots = range(size)); later releases reserve it",
}
SPEC_V2 = {  # kvspec's spec-v2 rules pre-claim the bonus slot; SGLang's resolve does not
    "spec.overalloc_bounded": "a decode reserves whole pages and pre-claims no bonus: it "
    "raises kv_allocated_len to ceil_page(committed + 2 * alloc_len) "
    "(eagle_prepare_for_decode; allocation_sizing.page_aligned_decode_alloc_lens where it "
    "exists), so allocated - committed reaches 2 * alloc_len - 1 + page_size - 1, and "
    "2 * alloc_len + page_size - 1 under overlap",
    "spec.committed_tracks_device": "no bonus slot is pre-claimed: _resolve_spec_v2_tokens "
    "commits the whole accepted run when the result is processed (committed = the "
    "verify's start under overlap, its end without), not start + 1",
}
# catalog ids the release's design does not promise: (the probe answers they need, ids)
NOT_APPLICABLE = (
    ({"row_zero": "handed_out"}, ROW_ZERO),
    ({"speculative": "eagle-v2", "spec_commit": "at_resolve"}, SPEC_V2),
)


def not_applicable(probes: Probes) -> dict[str, str]:
    """The catalog ids that do not hold by this release's design, each with the reason."""
    found = {name: f.answer for name, f in probes.found}
    waived: dict[str, str] = {}
    for answers, ids in NOT_APPLICABLE:
        if all(found.get(name) == answer for name, answer in answers.items()):
            waived.update(ids)
    return waived


def banner(version: str, module: str, probes: Probes) -> dict:
    """A driver's first line for a release ``module`` drives: each probe's answer and why,
    the catalog ids its design does not promise, the features beyond the plain ones."""
    return dict(
        ready=True,
        version=version,
        adapter=module,
        probes=probes.banner(),
        not_applicable=not_applicable(probes),
        supports=supports(probes),
    )


def supports(probes: Probes) -> list[str]:
    """Engine features beyond the plain ones the adapter drives on this release."""
    found = ["speculative"] if probes["speculative"] == "eagle-v2" else []
    return found + ([] if probes["kv_pools"] == "none" else ["swa", "mla"])


# ---- the installed release, asked ----


def _module(name: str):
    return importlib.import_module(SRT + name)


def _optional(name: str):
    return _module(name) if probes.has_module(SRT + name) else None


def _class(names: tuple[str, ...], cls: str):
    """``cls`` from the first of the modules ``names`` that has it."""
    for name in names:
        if probes.has_module(name) and hasattr(importlib.import_module(name), cls):
            return getattr(importlib.import_module(name), cls)
    raise Drift(f"no {cls} in {' or '.join(names)}")


def _allocator(cls: str):
    return getattr(_module("mem_cache.allocator"), cls)


def _ngram() -> Found:
    module = _optional("model_executor.model_runner_components.ngram_embedding_manager")
    return probes.ngram(module is not None, getattr(module, "NgramEmbeddingManager", None))


def _speculative() -> Found:
    batch_result = _module("managers.utils").GenerationBatchResult
    eagle_info = _optional("speculative.eagle_info")
    return probes.speculative(batch_result, getattr(eagle_info, "EagleDraftInput", None))


def _session_module() -> Found:
    return Found(probes.first_module(SESSION_MODULES), "the module Session lives in")


def _pool_builder(name: str, cls: str):
    """``cls`` of the pool-builder module ``name``; None where the release lacks it, or where
    it does not import here (swa and mla are then refused, the plain features still run)."""
    try:
        return getattr(_optional(name), cls, None)
    except ImportError:
        return None


def _kv_pools() -> Found:
    return probes.kv_pools(
        _pool_builder("mem_cache.kv_cache_configurator", "KVCacheConfigurator"),
        _pool_builder("model_executor.model_runner_kv_cache_mixin", "ModelRunnerKVCacheMixin"),
    )


def _swa_split() -> Found:
    mixin = _pool_builder("model_executor.model_runner_kv_cache_mixin", "ModelRunnerKVCacheMixin")
    return probes.swa_split(mixin)


TREE_CORE = SRT + "mem_cache.unified_cache.unified_tree_core"
# every switch, asked once the era is known: name -> the question
SWITCHES = {
    "checks": probes.checks,
    "page_invariants": lambda: probes.page_invariants(_optional(CHECKER.removeprefix(SRT))),
    "pool_hooks": lambda: probes.pool_hooks(_module("managers.scheduler").Scheduler),
    "allocator_kernels": lambda: probes.allocator_kernels(
        _allocator("PagedTokenToKVPoolAllocator")
    ),
    "free_pages": lambda: probes.free_pages(_allocator("TokenToKVPoolAllocator")),
    "session_module": _session_module,
    "session_flags": lambda: probes.session_flags(_class(SESSION_MODULES, "Session")),
    "slot_layout": lambda: probes.slot_layout(_class(SLOT_MODULES, "SessionSlot")),
    "req_kv": lambda: probes.req_kv(_module("managers.schedule_batch")),
    "fill": lambda: probes.fill(_module("managers.schedule_batch").Req),
    "batch_logits": lambda: probes.batch_logits(_module("managers.utils").GenerationBatchResult),
    "input_ids": lambda: probes.input_ids(_module("managers.io_struct")),
    "worker_info": lambda: probes.worker_info(_optional("runtime_context")),
    "ngram": _ngram,
    "row_zero": lambda: probes.row_zero(_module("mem_cache.memory_pool").ReqToTokenPool),
    "tree": lambda: probes.tree(probes.has_module(TREE_CORE)),
    "speculative": _speculative,
    "spec_headroom": lambda: probes.spec_headroom(_optional("mem_cache.allocation_sizing")),
    "spec_draft_runner": lambda: probes.spec_draft_runner(_optional("speculative.eagle_utils")),
    "kv_pools": _kv_pools,
    "swa_check": lambda: probes.swa_check(
        _module("managers.scheduler").Scheduler,
        getattr(_optional(CHECKER.removeprefix(SRT)), "SchedulerInvariantChecker", None),
    ),
    "swa_split": _swa_split,
    "swa_cursor": lambda: probes.swa_cursor(
        getattr(_module("managers.schedule_batch"), "ReqKvInfo", None)
    ),
    "spec_commit": lambda: probes.spec_commit(
        _optional("managers.scheduler_components.batch_result_processor")
    ),
}
GLOO_ONLY = {  # asked only where the driver initialises torch.distributed itself
    "dp_attention": lambda: probes.dp_attention(
        _module("layers.dp_attention").initialize_dp_attention
    ),
}


CONTEXT_ONLY = {  # asked only where the Scheduler bootstraps its own runtime
    "bind_threads": lambda: probes.bind_threads(_optional("distributed.bootstrap")),
}


def _ask(questions: dict, found: list, adapter: str) -> None:
    for name, question in questions.items():
        try:
            found.append((name, question()))
        except Drift as exc:
            raise Drift(f"{name}: {exc} (adapter: {adapter})", adapter) from None
        except (AttributeError, ImportError, TypeError) as exc:
            said = f"{name}: {type(exc).__name__}: {exc} (adapter: {adapter})"
            raise Drift(said, adapter) from None


def adapter_of(found: list) -> str:
    """The adapter module the era's two probes choose."""
    era = dict(found)
    launch, seams = era["launch"].answer, era["seams"].answer
    if (launch, seams) not in ADAPTERS:
        raise Drift(f"no adapter drives launch={launch} with seams={seams} (adapter: probes)")
    return ADAPTERS[(launch, seams)]


def probe_all() -> tuple[str, Probes]:
    """The adapter module and every probe, asked of the installed SGLang (its stubs installed
    first); ``Drift`` names the internal no adapter drives and the adapter chosen so far."""
    scheduler_cls = _module("managers.scheduler").Scheduler
    runtime_context = _optional("runtime_context")
    found: list[tuple[str, Found]] = []
    era = {
        "launch": lambda: probes.launch(scheduler_cls, runtime_context),
        "seams": lambda: probes.seams(scheduler_cls),
    }
    _ask(era, found, "probes")
    adapter = adapter_of(found)
    _ask(SWITCHES, found, adapter)
    _ask(GLOO_ONLY if found[0][1].answer == "gloo" else CONTEXT_ONLY, found, adapter)
    return adapter, Probes(tuple(found))
