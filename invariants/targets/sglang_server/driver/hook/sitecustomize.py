"""Runs first in every python of a server the sglang-server target launched (the launcher, and
the scheduler and detokenizer that multiprocessing spawns: fresh interpreters inheriting the
environment and PYTHONPATH). It puts the driver folders on the path and installs the import
stubs (sglang/driver/stubs.py) before anything imports sglang — sglang/__init__ imports triton.
Inert unless KVSPEC_SERVER_PATH is set; writes no __pycache__ into the checkout."""

import os
import sys

if os.environ.get("KVSPEC_SERVER_PATH"):
    sys.dont_write_bytecode = True
    sys.path[:0] = os.environ["KVSPEC_SERVER_PATH"].split(os.pathsep)
    import stubs

    stubs.install()
