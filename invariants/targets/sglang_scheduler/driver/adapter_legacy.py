"""The Scheduler whose model runner set torch.distributed up and whose loop receives and
sends through the Scheduler itself (seen in 0.5.10 to 0.5.12.post1: the launch probe says
``gloo``, the seams probe ``scheduler``): how it is launched and where its seams and its busy
check are. Everything else is adapter_common.py's, by the probes' answers.

Keeps: everything not named here or in adapter_common.py is SGLang's own code running for
real. Runs inside the sglang venv; imports nothing of kvspec.

Shims (why):
1. What ``ModelRunner.init_torch_distributed`` did, before the fake worker: one gloo rank, the
   model-parallel groups, DP attention (its signature from the dp_attention probe) — the
   Scheduler takes ``gpu_id`` and the ranks and leaves that to the runner, which is faked.
2. ``set_global_server_args_for_scheduler``: the release reads its server arguments from a
   module global (or the runtime context it fills).
3. ``Scheduler.recv_requests`` -> the driver's boundary (the trace's ops come in there);
   ``scheduler.send_to_detokenizer`` / ``send_to_tokenizer`` -> recorded (no sockets).
4. SGLang's busy check (``self_check_during_busy``) is called each iteration, its assertion
   recorded, not raised; skipped on hybrid SWA pools where the swa_check probe says the
   check is not hybrid-aware (it raises in SWARadixCache.evictable_size, or reports a false
   leak comparing min(full, swa) free with the full capacity; the release runs it only under
   SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY). kvspec's own pool rules still hold.
"""

from __future__ import annotations

import adapter_common
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.layers.dp_attention import initialize_dp_attention
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.server_args import PortArgs, ServerArgs, set_global_server_args_for_scheduler


class Adapter(adapter_common.Adapter):
    def launch(self, args: ServerArgs) -> Scheduler:
        """Shim 2, then the 9-argument Scheduler: one rank, no DP."""
        set_global_server_args_for_scheduler(args)
        return Scheduler(args, PortArgs.init_new(args), 0, 0, 0, 0, 0, 0, None)

    def before_worker(self, scheduler: Scheduler) -> None:
        """Shims 2 and 1, where the model runner did them: the global server arguments (again:
        SGLang's own launch of a server leaves them to the runner on 0.5.1x), and
        torch.distributed."""
        set_global_server_args_for_scheduler(scheduler.server_args)
        init_distributed_environment(
            backend="gloo",
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{scheduler.nccl_port}",
        )
        initialize_model_parallel(tensor_model_parallel_size=1)
        with_config = self.probes["dp_attention"] == "model_config"
        extra = {"model_config": scheduler.model_config} if with_config else {}
        initialize_dp_attention(server_args=scheduler.server_args, **extra)

    def set_receiver(self, scheduler: Scheduler, receive) -> None:
        """Shim 3: the loop's per-iteration receive hands over the trace's ops."""
        Scheduler.recv_requests = lambda self: receive(None)

    def real_receiver(self, scheduler: Scheduler):
        """SGLang's own receive (taken before ``set_receiver``), as the boundary calls it."""
        recv = Scheduler.recv_requests
        return lambda local_reqs=None: recv(scheduler)

    def output_channels(self, scheduler: Scheduler) -> tuple:
        """Where the scheduler sends to the detokenizer and to the tokenizer."""
        return scheduler.send_to_detokenizer, scheduler.send_to_tokenizer

    def set_output(self, scheduler: Scheduler, record) -> None:
        """Shim 3: what the scheduler sends to the detokenizer and the tokenizer."""
        for channel in self.output_channels(scheduler):
            channel.send_output = lambda out, *a, **k: record(out)

    def busy_check(self, scheduler: Scheduler) -> str | None:
        """Shim 4: SGLang's busy check; its assertion's message, or None."""
        if self.swa and self.probes["swa_check"] == "no":
            return None
        try:
            scheduler.self_check_during_busy()
        except AssertionError as exc:
            return str(exc)
        return None
