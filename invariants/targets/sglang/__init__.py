"""The sglang target: real SGLang 0.5.23 memory classes on CPU, in their own venv and process.

kvspec imports nothing of sglang: ``target.py`` launches ``driver/main.py`` with the sglang
venv's python and speaks JSON lines (ops in, state views out); ``views.py`` turns those views
into StateView objects for the same Checker and catalog.
"""
