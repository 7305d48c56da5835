"""The sglang target: real SGLang 0.5.23 memory classes on CPU, under kvspec's scheduler glue.

``adapter.py`` is how the rest of kvspec runs it; ``driver/`` runs under the sglang venv's
python (the glue, SGLang's stack, the state reader, and the import stubs every SGLang driver
shares). Beside the common commands: ``differential.py`` (with ``gaps.py``) runs kvspec's
engine and SGLang's memory classes in lockstep, ``scenarios.py`` holds built-in traces, and
``commands.py`` is `kvspec sglang run|diff|check`.
"""
