"""The sglang-scheduler target: SGLang's REAL Scheduler and event loop on CPU, one release per
venv, with only the model forward faked (``driver/sched_*.py`` and ``driver/shim_<ver>.py``).

kvspec imports nothing of sglang: ``target.py`` launches the driver under the release's venv
and speaks JSON lines; ``trace.py`` turns the project's op trace into the driver's ops;
``run.py`` checks every iteration with the same catalog and records, beside it, what SGLang's
own checkers said; ``history.py`` lays the releases side by side; ``explore.py`` searches
seeds on the real scheduler; ``lockstep.py`` runs kvspec's scheduler beside it.
"""
