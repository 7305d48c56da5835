"""The Scheduler that bootstraps its own runtime from published ranks (seen from 0.5.21: the
launch probe says ``context``, the seams probe ``components``): the seams and the busy check
are adapter_components.py's; the launch publishes the ranks and leaves torch.distributed to
SGLang's own bootstrap.

Keeps: everything not named here, in adapter_components.py or in adapter_common.py is
SGLang's own code running for real. Runs inside the sglang venv; imports nothing of kvspec.

Shims (why):
1. ``bootstrap._bind_threads_if_cpu`` -> no-op where the release has it (the bind_threads
   probe): it asserts NUMA information a CPU VM lacks.
2. ``runtime_context.publish(ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))``: the
   two-argument Scheduler reads its ranks from the runtime context (one rank, no DP).
"""

from __future__ import annotations

import adapter_components
from sglang.srt import runtime_context
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.server_args import PortArgs, ServerArgs


class Adapter(adapter_components.Adapter):
    def launch(self, args: ServerArgs) -> Scheduler:
        """Shims 1 and 2, then the two-argument Scheduler (its own bootstrap runs)."""
        if self.probes["bind_threads"] == "present":
            from sglang.srt.distributed import bootstrap

            bootstrap._bind_threads_if_cpu = lambda *, device: None
        ports = PortArgs.init_new(args)
        ranks = runtime_context.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0)
        runtime_context.publish(args, role="scheduler", ranks=ranks)
        return Scheduler(args, ports)

    def before_worker(self, scheduler: Scheduler) -> None:
        """Nothing: the Scheduler's bootstrap set torch.distributed up itself."""
