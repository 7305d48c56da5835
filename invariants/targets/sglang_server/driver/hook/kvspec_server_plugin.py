"""kvspec's SGLang general plugin (entry point group ``sglang.srt.plugins``, found through this
folder's dist-info on PYTHONPATH, never pip-installed). SGLang's ``load_plugins()`` calls
``register`` early in every process; in the scheduler process (``run_scheduler_process``, just
before it builds the Scheduler) it connects to the driver, probes the release as the
sglang-scheduler driver does, applies that adapter's shims and installs the gate (gate.py).
Elsewhere it does nothing. Inert unless KVSPEC_SERVER_CONFIG is set; without a control socket
(KVSPEC_SERVER_CONTROL: a reproducer's validation run) only the fake worker is installed —
no gate, wall-clock time, and SGLang's own memory checks raise as they do in its CI."""

import importlib
import os
import sys

STRICT_CHECKS = {  # SGLang's own busy and idle memory checks raise (its CI's setting)
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
}


def in_scheduler_process() -> bool:
    """SGLang calls ``load_plugins()`` at the top of ``run_scheduler_process`` (0.5.11+)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "run_scheduler_process":
            return True
        frame = frame.f_back
    return False


def register() -> None:
    if not os.environ.get("KVSPEC_SERVER_CONFIG") or not in_scheduler_process():
        return
    import json

    import gate
    import release_probes

    gate.OURS = tuple(os.environ["KVSPEC_SERVER_PATH"].split(os.pathsep))
    cfg = json.loads(os.environ["KVSPEC_SERVER_CONFIG"])
    if not os.environ.get("KVSPEC_SERVER_CONTROL"):  # a reproducer's validation: no gate
        module, probes = release_probes.probe_all()
        importlib.import_module(module).Adapter(probes).prepare(cfg)
        gate.install_worker(scheduler_class(), cfg)
        os.environ.update(STRICT_CHECKS)
        return
    control = gate.Control.connect(os.environ["KVSPEC_SERVER_CONTROL"])
    control.say(**gated(cfg, control))


def gated(cfg: dict, control) -> dict:
    """The release's adapter and the gate installed; the banner (or why not, then raised:
    SGLang logs a plugin that failed and goes on, into the driver's stop)."""
    import gate
    import release_probes
    import sglang

    version = sglang.__version__
    try:
        module, probes = release_probes.probe_all()
        adapter = importlib.import_module(module).Adapter(probes)
        adapter.prepare(cfg)
        gate.install(scheduler_class(), adapter, cfg, control)
    except release_probes.Drift as exc:
        control.say(ready=False, version=version, drift=True, error=str(exc), adapter=exc.adapter)
        raise
    except Exception as exc:
        control.say(ready=False, version=version, **gate.answers.failure(exc, gate.OURS, "sglang"))
        raise
    return release_probes.banner(version, module, probes)


def scheduler_class():
    from sglang.srt.managers.scheduler import Scheduler

    return Scheduler
