"""The sglang-scheduler target: SGLang's REAL Scheduler and event loop on CPU, one release per
venv, with only the model forward faked.

``adapter.py`` is how the rest of kvspec runs it (its config op, what it cannot run, how the
explorer draws its seeds); ``releases.py`` finds a release's venv and starts the driver;
``driver/`` runs under the release's own interpreter (``main.py``, the probes that pick the
adapter for the installed code, one adapter per era of SGLang's scheduler, the seams to its
loop, the state reader, the fake workers).
Beside the common commands: ``history.py`` lays the releases side by side, ``seed_bugs.py``
times exploration to each shipped seed bug, ``lockstep.py`` (with ``gaps.py`` and
``known.py``) runs kvspec's scheduler beside the real one, and ``commands.py`` is
`kvspec sglang history|lockstep|seed-bugs`.
"""
