"""The `kvspec` command line (console script `kvspec = invariants.cli:app`).

Each module of this package attaches its commands to the app of `invariants.cli.app`.
"""

from invariants.cli import (  # noqa: F401 - registers the commands
    bench,
    bugs,
    catalog,
    explore,
    lockstep,
    report,
    run,
    scheduler,
    serve,
    sglang,
)
from invariants.cli.app import app

__all__ = ["app"]
