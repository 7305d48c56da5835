"""The vllm driver's seeded KV connector: vLLM's connector API (``KVConnectorBase_V1``, with
``SupportsHMA`` for hybrid groups) on the scheduler side, and the worker side's answers
faked as the driver's model runner reports them (``KVConnectorOutput``). Modelled on vLLM's
own test connector (tests/v1/kv_connector/unit/utils.py ``MockKVConnector``: matched tokens,
async loads, deferred matching) with every choice drawn from a seeded coin:

- consumer (``kv_consumer``/``kv_both``): a request's lookup defers now and then (``None``:
  vLLM asks again next step), else matches some external tokens past its local hit (always
  leaving one to compute), loaded synchronously in the step or asynchronously over 1 to
  ``max_delay`` steps (the request waits in WAITING_FOR_REMOTE_KVS holding its blocks); a
  load fails with ``fail_prob`` (its first block reported invalid; a hybrid layout reports
  the request in ``failed_recving``, as vLLM requires there), and the request's external KV
  is then gone (no later lookup matches it: a remote that fails every time would keep vLLM
  reloading it forever);
- producer (``kv_producer``/``kv_both``): a finished request's blocks are sent with
  ``send_prob``: ``request_finished`` answers "delay the free" and the send finishes 1 to
  ``max_delay`` steps later (``finished_sending``), when vLLM frees the blocks.

Runs inside the vllm venv; registered with vLLM's ``KVConnectorFactory`` by ``register``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)
from vllm.v1.outputs import KVConnectorOutput

NAME = "KvspecSeededConnector"
# probed: some releases (0.29.0, 0.28.0) have no per-request failure report
# (``failed_recving``), and their invalid-block path unpacks one KV-cache group (a TODO
# there): a hybrid layout's load never fails on them
FAILED_RECVING = "failed_recving" in getattr(KVConnectorOutput, "__dataclass_fields__", {})


@dataclass
class Transfer:
    due: int  # the step whose output reports it finished
    blocks: list[int] = field(default_factory=list)  # a load's target blocks (group 0)
    failed: bool = False


class SeededConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config, role, kv_cache_config) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.seed, self.now = extra.get("seed", 0), 0
        self.rates = {k: float(extra.get(k, 0.0)) for k in RATES}
        self.max_delay = int(extra.get("max_delay", 3))
        self.consumer = self._kv_transfer_config.is_kv_consumer
        self.producer = self._kv_transfer_config.is_kv_producer
        self.hybrid = len(kv_cache_config.kv_cache_groups) > 1
        self.block_size = vllm_config.cache_config.block_size
        self.matched: dict[str, tuple[int, bool]] = {}  # rid -> (local hit, async) answered
        self.defers: dict[tuple[str, int], int] = {}
        self.loads: dict[str, Transfer] = {}  # async loads not yet reported
        self.sync_failures: set[int] = set()  # blocks of this step's failed sync loads
        self.sends: dict[str, Transfer] = {}
        self.lost: set[str] = set()  # rids whose load failed: their external KV is gone
        self.counts = dict.fromkeys(COUNTS, 0)

    def coin(self, *key) -> random.Random:
        return random.Random(f"{self.seed}:" + ":".join(map(str, key)))

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        rid = request.request_id
        if not self.consumer:
            return 0, False
        admission = (rid, request.num_preemptions)
        coin = self.coin(rid, request.num_preemptions, num_computed_tokens)
        if admission not in self.defers:
            self.defers[admission] = coin.randint(1, 2) if coin.random() < self._r("defer") else 0
        if self.defers[admission] > 0:
            self.defers[admission] -= 1
            self.counts["defers"] += 1
            return None, False
        room = request.num_tokens - 1 - num_computed_tokens  # one token left to compute
        if room < 1 or rid in self.lost or coin.random() >= self._r("hit"):
            return 0, False
        tokens, is_async = coin.randint(1, room), coin.random() < self._r("async")
        self.matched[rid] = (num_computed_tokens, is_async)
        return tokens, is_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        """A load into the blocks of the external tokens [local hit, + num_external_tokens)."""
        rid = request.request_id
        local, is_async = self.matched.pop(rid, (0, False))
        if not num_external_tokens:
            return
        coin = self.coin(rid, request.num_preemptions, "load")
        size = self.block_size
        end = -(-(local + num_external_tokens) // size)
        target = blocks.get_block_ids()[0][local // size : end]
        # a hybrid layout reports a failure per request (failed_recving, for async loads only)
        reportable = not self.hybrid or (is_async and FAILED_RECVING)
        failed = coin.random() < self._r("fail") and reportable
        if failed:  # the remote copy is gone: the request recomputes, never loads again
            self.lost.add(rid)
        if is_async:
            self.loads[rid] = Transfer(self.now + coin.randint(1, self.max_delay), target, failed)
            self.counts["async_loads"] += 1
        elif failed and target:
            self.sync_failures.add(target[0])  # reported in this step's output
        self.counts["loads"] += 1
        self.counts["failed_loads"] += failed

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return KVConnectorMetadata()  # no worker reads it: the transfers are timed here

    def request_finished(self, request, block_ids):
        return self._finished(request)

    def request_finished_all_groups(self, request, block_ids):
        return self._finished(request)

    def _finished(self, request) -> tuple[bool, None]:
        """Send a finished request's KV now and then (never one still loading)."""
        rid = request.request_id
        if not self.producer or rid in self.loads:
            return False, None
        coin = self.coin(rid, "send")
        if coin.random() >= self._r("send"):
            return False, None
        self.sends[rid] = Transfer(self.now + coin.randint(1, self.max_delay))
        self.counts["sends"] += 1
        return True, None

    # the worker side's answers, as the fake model runner reports them
    def output(self, step: int) -> KVConnectorOutput | None:
        """What the worker connectors report in step ``step``'s output: the transfers due."""
        recv = {r for r, t in self.loads.items() if t.due <= step}
        sent = {r for r, t in self.sends.items() if t.due <= step}
        invalid, self.sync_failures = set(self.sync_failures), set()
        failed_recving = set()
        for rid in recv:
            load = self.loads.pop(rid)
            if load.failed and self.hybrid:
                failed_recving.add(rid)
            elif load.failed and load.blocks:
                invalid.add(load.blocks[0])
        for rid in sent:
            del self.sends[rid]
        if not (recv or sent or invalid):
            return None
        reported = {"failed_recving": failed_recving} if FAILED_RECVING else {}
        return KVConnectorOutput(
            finished_sending=sent or None,
            finished_recving=recv or None,
            invalid_block_ids=invalid,
            **reported,
        )

    def _r(self, name: str) -> float:
        return self.rates[f"{name}_prob"]

    # the worker-side half of the API: no worker runs here
    def start_load_kv(self, forward_context, **kwargs) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


RATES = ("hit_prob", "async_prob", "fail_prob", "defer_prob", "send_prob")
COUNTS = ("defers", "loads", "async_loads", "failed_loads", "sends")


def register() -> None:
    """Make the connector known to vLLM's factory by name (once per process)."""
    if NAME not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(NAME, __name__, SeededConnector.__name__)


def transfer_config(spec: dict | None) -> KVTransferConfig | None:
    """vLLM's KV-transfer config selecting the seeded connector: ``spec`` holds its role
    (kv_consumer | kv_producer | kv_both), seed, rates and ``max_delay``; a failed load is
    recomputed (vLLM's ``kv_load_failure_policy="recompute"``)."""
    if not spec:
        return None
    register()
    return KVTransferConfig(
        kv_connector=NAME,
        kv_role=spec["role"],
        kv_connector_extra_config=dict(spec),
        kv_load_failure_policy="recompute",
    )
