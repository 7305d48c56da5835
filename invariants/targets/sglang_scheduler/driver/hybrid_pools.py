"""The fake worker of a hybrid SWA or MLA configuration: its pools built by the release's OWN
pool code, found by the ``kv_pools`` probe — ``configurator`` (``KVCacheConfigurator.configure``,
as ``ModelRunner.alloc_memory_pool`` runs it) or ``mixin`` (``ModelRunnerKVCacheMixin.
init_memory_pool`` on the fake runner) — so the classes, sizes and layer split are the ones
a real runner of that release builds (SWAKVPool + SWATokenToKVPoolAllocator, or
MLATokenToKVPool).

Keeps: the only figures the driver gives the pool code are the two a CPU box cannot (the
byte budget: 1 GiB, so ``--max-total-tokens`` bounds the pools as on a GPU whose budget
exceeds the cap; and the request-row count: the trace's ``max_reqs``). Runs inside the
sglang venv; imports nothing of kvspec.

Shims (why):
1. ``_profile_available_bytes`` / ``profile_max_num_token`` -> 1 GiB; ``resolve_max_num_reqs``
   / ``_resolve_max_num_reqs`` -> the trace's rows (no device to profile).
2. ``_fit_split`` (the swa_split probe says ``bytes``): that release splits the capped
   capacity between the pools by bytes, so ``--max-total-tokens`` is not the full pool's
   size; the (cap, ratio) a user would pass to get the trace's sizes is searched through the
   release's own split.
3. The configurator's and ``resolve_layer_indices``' keyword arguments are those their
   signatures take (the dataclass moved from ``ps`` to ``attn_dp_size``/``pp_size``).
4. The mixin path resets ``attention_backend`` to ``torch_native`` after GPT-OSS's ServerArgs
   check, before its pools (as the plain configuration has it); a release that resolves its
   arguments read-only (the configurator path) keeps ``triton``.
5. ``support_triton`` -> False where the rows are written (``mem_cache.allocation`` or
   ``.common``): with ``triton`` configured it would launch a Triton kernel on CPU.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from types import SimpleNamespace

import pools
import torch
from worker import FakeRunner, FakeWorker

BUDGET = 1 << 30
SRT = "sglang.srt."
RUNNER = SRT + "model_executor.model_runner"
COMPONENTS = SRT + "model_executor.model_runner_components."
RUNNER_PROPERTIES = (
    "logical_max_total_num_tokens",
    "effective_max_total_num_tokens",
    "effective_logical_max_total_num_tokens",
)


class HybridWorker(FakeWorker):
    """``TpModelWorker``'s view of the hybrid pools: ``is_hybrid_swa`` and the window are the
    runner's; ``get_tokens_per_layer_info`` is (full, swa)."""

    def get_tokens_per_layer_info(self):
        runner = self.model_runner
        return runner.full_max_total_num_tokens, runner.swa_max_total_num_tokens


def hybrid_worker(scheduler, cfg: dict, probes, make_result) -> FakeWorker:
    """The worker of a hybrid SWA or MLA configuration, its pools the release's own."""
    if cfg.get("speculative"):
        raise ValueError("speculative decoding on hybrid SWA or MLA pools is not driven here")
    build = _configured if probes["kv_pools"] == "configurator" else _mixed
    runner = build(scheduler, cfg, probes)
    refuse_other_pools(runner, cfg)
    no_triton_writes()
    for name in RUNNER_PROPERTIES:  # the runner's own properties over its figures
        prop = getattr(importlib.import_module(RUNNER).ModelRunner, name, None)
        if isinstance(prop, property):
            setattr(runner, name, prop.fget(runner))
    if probes["ngram"] != "none":
        runner.ngram_embedding_manager = pools._ngram_manager(
            runner, scheduler, probes, cfg["max_reqs"]
        )
    info = worker_info(runner, scheduler, cfg, probes["worker_info"])
    worker = HybridWorker(runner, info, make_result, cfg)
    worker.is_hybrid_swa, worker.sliding_window_size = (
        runner.is_hybrid_swa,
        runner.sliding_window_size,
    )
    return worker


def refuse_other_pools(runner, cfg: dict) -> None:
    """A configuration the release did not build as asked is refused, never run on other
    pools: MLA needs the MLA backend's pool, hybrid SWA the hybrid pools with the window."""
    pool = type(runner.token_to_kv_pool).__name__
    if cfg.get("mla") and not runner.use_mla_backend:
        raise ValueError(f"mla: this release's ModelConfig is not MLA here (built {pool})")
    window = (cfg.get("swa") or {}).get("window")
    if cfg.get("swa") and (not runner.is_hybrid_swa or runner.sliding_window_size != window):
        said = f"hybrid={runner.is_hybrid_swa}, window={runner.sliding_window_size}"
        raise ValueError(f"swa: this release built {pool} ({said}), not window {window}")


def worker_info(runner, scheduler, cfg: dict, source: str) -> tuple:
    """``TpModelWorker.get_worker_info`` over the pools built: the capacity is the runner's
    (the full pool's), the longest request bounded by ``max_token_pool_size`` where the
    runner has that property (0.5.10.x: min(swa, full))."""
    capacity = runner.max_total_num_tokens
    base = pools.worker_info(runner, scheduler, dict(cfg, pool_tokens=capacity), source)
    prop = getattr(importlib.import_module(RUNNER).ModelRunner, "max_token_pool_size", None)
    bound = prop.fget(runner) if isinstance(prop, property) else capacity
    usable = min(cfg["max_context"], bound)
    return (*base[:4], usable - 1, usable - 6, *base[6:])


def _attrs(scheduler, cfg: dict, model, window) -> dict:
    """What ``ModelRunner.__init__`` / ``load_model`` set that the pool code reads."""
    config = scheduler.model_config
    arch = importlib.import_module(SRT + "configs.model_config").AttentionArch
    layers = config.num_hidden_layers
    return dict(
        pools.RUNNER_ATTRS,
        server_args=scheduler.server_args,
        model=model,
        gpu_id=0,
        page_size=cfg["page_size"],
        kv_cache_dtype=torch.float16,
        dtype=torch.float32,
        is_hybrid_swa=bool(config.is_hybrid_swa),
        is_hybrid_swa_compress=bool(getattr(config, "is_hybrid_swa_compress", False)),
        use_mla_backend=config.attention_arch == arch.MLA,
        sliding_window_size=window,
        is_draft_worker=False,
        spec_algorithm=_no_speculation(),
        enable_hisparse=False,
        start_layer=0,
        end_layer=layers,
        num_effective_layers=layers,
        dp_size=1,
        pp_size=1,
        tp_size=1,
        max_running_requests=cfg["max_reqs"],
        rows=cfg["max_reqs"],
    )


def _torch_native(args) -> None:
    """Shim 4: back to the plain configuration's backend once GPT-OSS's check has passed."""
    args.attention_backend = "torch_native"
    args.prefill_attention_backend = args.decode_attention_backend = None


def no_triton_writes() -> None:
    """Shim 5: ``support_triton`` in the module that writes request rows answers False, as
    a release that asks the platform answers on CPU (its own torch fallback runs)."""
    for name in ("mem_cache.allocation", "mem_cache.common"):
        try:
            module = importlib.import_module(SRT + name)
        except ModuleNotFoundError:  # the writer lives in the other one in this release
            continue
        if hasattr(module, "support_triton"):
            module.support_triton = lambda *args, **kwargs: False


def _no_speculation():
    spec_info = importlib.import_module(SRT + "speculative.spec_info")
    return spec_info.SpeculativeAlgorithm.from_string(None)


def _window(model, config):
    """``ModelRunner.load_model``'s window: the model class's own, else the config's."""
    if hasattr(model, "get_attention_sliding_window_size"):
        return model.get_attention_sliding_window_size()
    return config.sliding_window_size if config.is_hybrid_swa else None


# ---- mixin: ModelRunnerKVCacheMixin.init_memory_pool (0.5.10 ... 0.5.15) ----


def _pool_runner_class():
    """The fake runner with the release's pool mixin (shim 1 overrides the budget)."""
    mixin_module = importlib.import_module(RUNNER + "_kv_cache_mixin")

    class PoolRunner(FakeRunner, mixin_module.ModelRunnerKVCacheMixin):
        def _profile_available_bytes(self, pre_model_load_memory: int) -> int:
            return BUDGET

        def profile_max_num_token(self, pre_model_load_memory: int) -> int:
            return BUDGET // self.get_cell_size_per_token(self.num_effective_layers)

        def _resolve_max_num_reqs(self, token_capacity: int) -> int:
            return self.rows

    return PoolRunner


def _mixed(scheduler, cfg: dict, probes) -> FakeRunner:
    import hybrid

    args = scheduler.server_args
    _torch_native(args)
    model = hybrid.release_model(scheduler.model_config)
    attrs = _attrs(scheduler, cfg, model, _window(model, scheduler.model_config))
    attrs.update(memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None)
    attrs.update(mem_fraction_static=args.mem_fraction_static, mambaish_config=None)
    runner = _pool_runner_class()(scheduler.model_config, {}, attrs)
    if probes["swa_split"] == "bytes" and runner.is_hybrid_swa:
        _fit_split(runner, cfg)
    runner.init_memory_pool(pre_model_load_memory=0)
    return runner


def split_candidates(full: int, swa: int, page: int):
    """(cap, ratio) pairs to try, nearest first: the byte split gives full > cap > swa."""
    middle = (full + swa) // 2
    for capacity in range(max(page, middle - 4 * page), middle + 4 * page + 1):
        for ratio in (swa / full, (swa + 0.5) / full, (swa + 0.25) / full):
            if ratio <= 1:
                yield capacity, ratio


def _fit_split(runner, cfg: dict) -> None:
    """Shim 2: the (max_total_tokens, swa_full_tokens_ratio) for which the release's own
    ``_resolve_hybrid_swa_tokens`` gives the trace's (pool_tokens, swa tokens)."""
    args, page, full = runner.server_args, cfg["page_size"], cfg["pool_tokens"]
    swa = (cfg["swa"].get("tokens") or int(full * args.swa_full_tokens_ratio)) // page * page
    for capacity, ratio in split_candidates(full, swa, page):
        args.max_total_tokens, args.swa_full_tokens_ratio = capacity, ratio
        capped = runner._resolve_token_capacity(BUDGET << 10)
        _, got_full, got_swa = runner._resolve_hybrid_swa_tokens(capped)
        if (got_full, got_swa) == (full, swa):
            return
    raise ValueError(f"this release cannot split its pools into full={full}, swa={swa}")


# ---- configurator: KVCacheConfigurator.configure (0.5.16 ...) ----


def _configurator_class():
    module = importlib.import_module(SRT + "mem_cache.kv_cache_configurator")

    class Configurator(module.KVCacheConfigurator):
        __slots__ = ()
        rows = 0  # set per build (a class attribute: the dataclass may have slots)

        def _profile_available_bytes(self, pre_model_load_memory: int) -> int:
            return BUDGET

        def resolve_max_num_reqs(self, token_capacity: int) -> int:
            return type(self).rows

    return Configurator


def taken(fn, offered: dict) -> dict:
    """Shim 3: the keyword arguments of ``offered`` that ``fn`` (or a dataclass) takes."""
    if dataclasses.is_dataclass(fn):
        names = {f.name for f in dataclasses.fields(fn) if f.init}
    else:
        names = set(inspect.signature(fn).parameters)
    return {k: v for k, v in offered.items() if k in names}


def _configurator_args(scheduler, attrs: dict, layer_info) -> dict:
    """What ``ModelRunner.init_kv_cache_configurator`` passes, for one CPU rank."""
    aux = importlib.import_module(COMPONENTS + "spec_aux_hidden_state").SpecAuxHiddenStateConfig
    one = SimpleNamespace(attn_dp_size=1, pp_size=1, tp_size=1, attn_tp_size=1, dp_size=1)
    return dict(
        attrs,
        device="cpu",
        attn_dp_size=1,
        ps=one,
        pp_group=None,
        model_config=scheduler.model_config,
        kv_cache_dtype_str="auto",
        model_dtype=torch.float32,
        post_capture_kv_active=False,
        spec_aux_config=aux(),
        layer_info=layer_info,
        forward_stream=None,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        memory_pool_config=None,
    )


def _configured(scheduler, cfg: dict, probes) -> FakeRunner:
    import hybrid

    config = scheduler.model_config
    model = hybrid.release_model(config)
    setup = importlib.import_module(COMPONENTS + "layer_setup").resolve_layer_indices
    offered = dict(model=model, model_config=config, is_draft_worker=False)
    layer_info = setup(**taken(setup, dict(offered, spec_algorithm=_no_speculation())))
    window = importlib.import_module(COMPONENTS + "load_model_utils")
    attrs = _attrs(scheduler, cfg, model, window.resolve_sliding_window_size(model, config))
    cls = _configurator_class()
    cls.rows = cfg["max_reqs"]
    configurator = cls(**taken(cls, _configurator_args(scheduler, attrs, layer_info)))
    result = configurator.configure(pre_model_load_memory=0)
    found = {f: getattr(result, f) for f in ("token_to_kv_pool", "token_to_kv_pool_allocator")}
    found["req_to_token_pool"] = result.req_to_token_pool
    attrs.update(layer_info=layer_info, memory_pool_config=result.memory_pool_config)
    attrs["kv_cache_configurator"] = configurator  # the runner's capacity properties read it
    for name in ("max_total_num_tokens", "full_max_total_num_tokens", "swa_max_total_num_tokens"):
        attrs[name] = getattr(result, name)
    attrs["max_running_requests"] = result.max_running_requests
    return FakeRunner(config, found, attrs)
