"""The `kvspec` command line (console script `kvspec = invariants.cli:main`).

Each module of this package attaches its commands to the app of `invariants.cli.app`.
``main`` runs the app and turns a mistake of the user's — a file that cannot be read, a spec
or a config that does not parse, a bad flag value — into one line naming it, exit 2 (click's
usage errors are exit 2 too); exit 1 stays for findings. ``--debug`` anywhere on the command
line shows the traceback instead.
"""

from __future__ import annotations

import sys

import typer
import yaml

from engine.errors import ConfigError
from invariants.campaigns.config import CampaignError
from invariants.checking.loader import CatalogError
from invariants.cli import (  # noqa: F401 - registers the commands
    bench,
    bugs,
    campaign,
    catalog,
    explore,
    report,
    run,
    serve,
    targets,
)
from invariants.cli.app import app
from invariants.fleet import FleetError, JournalError
from invariants.scenarios.ops import TraceError
from invariants.scenarios.spec import SpecError
from invariants.targets.driver import AdapterDrift, TargetUnavailable
from invariants.targets.registry import UnknownTarget

USER_ERRORS = (
    OSError,
    SpecError,
    ConfigError,
    CatalogError,
    TraceError,
    yaml.YAMLError,
    TargetUnavailable,
    AdapterDrift,
    UnknownTarget,
    JournalError,
    FleetError,
    CampaignError,
)


def user_error_line(exc: BaseException) -> str:
    """One line per problem, naming the thing (a file: its path and what went wrong; a real
    target: why it cannot run, or where its adapter no longer fits the release)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"kvspec: cannot read {exc.filename}: {exc.strerror or exc}"
    if isinstance(exc, AdapterDrift):
        return f"kvspec: adapter drift: {exc}"
    return "\n".join(f"kvspec: {line}" for line in str(exc).splitlines() if line.strip())


def usage_error_line(exc: typer.TyperException) -> str:
    """A usage error (a bad flag or value; click's, as typer vendors it) in one line, with
    where the help is."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "kvspec"
    return f"{command}: {exc.format_message()} (see {command} --help)"


def main(argv: list[str] | None = None) -> None:
    """The console script: the app, with user errors as one line and exit 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    try:
        code = app(args, prog_name="kvspec", standalone_mode=False)
    except typer.Abort:
        print("kvspec: aborted", file=sys.stderr)
        sys.exit(1)
    except typer.TyperException as exc:  # click's usage errors: exit 2
        if debug:
            raise
        print(usage_error_line(exc), file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 2))
    except USER_ERRORS as exc:
        if debug:
            raise
        print(user_error_line(exc), file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
