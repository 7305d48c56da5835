"""The real engines kvspec checks, each a target: its own code run on CPU in its own venv and
process, with only the model forward faked, its state streamed as views into the same checker
and catalog as kvspec's engine.

The engine-neutral core: ``registry.py`` (every target, one entry, and the ``Adapter`` its
folder provides), ``driver.py`` (the JSON-lines driver process), ``ops.py`` (trace →
driver ops), ``drive.py`` (one trace through one driver, every view checked), ``views.py``
(views → StateView, census on this side), ``outcome.py`` (what a run gave), ``run.py`` (a
spec or trace on a target), ``explore.py`` and ``replay.py`` (seeds, shrinking, replay on any
target); ``driverlib/`` is what every driver shares under its engine's interpreter. One folder
per engine: ``sglang/`` (memory classes), ``sglang_scheduler/`` (the real scheduler),
``vllm/`` (v1 scheduler) — each with the ``driver/`` that runs there.
"""
