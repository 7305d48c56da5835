"""The Scheduler whose model runner set torch.distributed up and whose loop receives and
sends through its components (seen in 0.5.13 to 0.5.20: the launch probe says ``gloo``, the
seams probe ``components``): the launch is adapter_legacy.py's; the seams are the
``request_receiver`` and ``ipc_channels`` components, the busy check the
``invariant_checker``'s.

Keeps: everything not named here, in adapter_legacy.py or in adapter_common.py is SGLang's
own code running for real. Runs inside the sglang venv; imports nothing of kvspec.

Shims (why):
1. ``request_receiver.recv_requests`` -> the driver's boundary (with the loop's
   ``local_reqs``, where it passes them): a frozen component, so its class is patched (one
   scheduler per driver process). ``ipc_channels.send_to_*`` -> recorded (no sockets).
2. SGLang's busy check is evaluated without its assert: its pool sum
   (``_check_full_pool`` over ``_get_total_uncached_sizes``), then its page invariants
   (``_check_kv_page_invariants``) where the page_invariants probe finds them; on hybrid SWA
   pools its SWA pool sum (``_check_swa_pool``) too; what they say is recorded each iteration.
"""

from __future__ import annotations

import inspect

import adapter_legacy
from sglang.srt.managers.scheduler import Scheduler


class Adapter(adapter_legacy.Adapter):
    def set_receiver(self, scheduler: Scheduler, receive) -> None:
        """Shim 1: the loop's per-iteration receive hands over the trace's ops."""
        type(scheduler.request_receiver).recv_requests = lambda self, local_reqs=None: receive(
            local_reqs
        )

    def real_receiver(self, scheduler: Scheduler):
        """SGLang's own receive (taken before ``set_receiver``); the loop's ``local_reqs``
        passed on where the release's receive takes them (0.5.20 on, not 0.5.13 – 0.5.19)."""
        receiver = scheduler.request_receiver
        recv = type(receiver).recv_requests
        if "local_reqs" in inspect.signature(recv).parameters:
            return lambda local_reqs=None: recv(receiver, local_reqs=local_reqs)
        return lambda local_reqs=None: recv(receiver)

    def output_channels(self, scheduler: Scheduler) -> tuple:
        """Shim 1: the ``ipc_channels`` component's senders (what ``set_output`` records)."""
        channels = scheduler.ipc_channels
        return channels.send_to_detokenizer, channels.send_to_tokenizer

    def busy_check(self, scheduler: Scheduler) -> str | None:
        """Shim 2: the pool sum over the rows SGLang counts as request-owned, then its page
        invariants; the message of a leak, or None."""
        checker = scheduler.invariant_checker
        uncached, swa_uncached = checker._get_total_uncached_sizes()
        stats = scheduler.pool_stats_observer.get_pool_stats()
        leak, message = checker._check_full_pool(stats, uncached=uncached)
        if self.swa:
            swa_leak, swa_message = checker._check_swa_pool(stats, uncached=swa_uncached)
            if swa_leak:
                return f"SWA Pool Mem Leak Detected! {swa_message}"
        if self.probes["page_invariants"] == "yes":
            try:
                checker._check_kv_page_invariants()  # reports through record_checks' sink
            except AssertionError as exc:
                return f"page invariants: {exc}"
        return f"Full Pool Mem Leak Detected! {message}" if leak else None
