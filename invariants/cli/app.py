"""The `kvspec` Typer application and its command groups; command modules attach to these.

Keeps: command functions stay tiny — each parses its arguments and calls one library function
(imported inside the command, so `kvspec --help` stays fast).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from invariants.targets.registry import NAMES, TARGETS, TargetOptions, UnknownTarget
from invariants.terminal import Format

# click's own help layout: it wraps descriptions at words and never cuts a flag (rich's
# panels cut flag names to fit a narrow terminal or a pipe's 80 columns)
PLAIN_HELP: dict[str, Any] = {"rich_markup_mode": None, "pretty_exceptions_enable": False}

app = typer.Typer(
    **PLAIN_HELP,
    help="kvspec: spec-driven verification of KV-cache accounting.",
    no_args_is_help=True,
    add_completion=False,
)
invariants_app = typer.Typer(help="The invariant catalog.", no_args_is_help=True, **PLAIN_HELP)
app.add_typer(invariants_app, name="invariants")
bench_app = typer.Typer(
    help="Benchmarks (results: docs/benchmarks.md).", no_args_is_help=True, **PLAIN_HELP
)
app.add_typer(bench_app, name="bench")


@app.callback()
def _options(
    debug: Annotated[
        bool,
        typer.Option("--debug", help="On an error, show the traceback (anywhere on the line)."),
    ] = False,
) -> None:
    """kvspec: spec-driven verification of KV-cache accounting (exit 1: a finding; 2: a
    mistake in a file or flag, said in one line)."""
    # read by invariants.cli.main before the app runs; declared here to show in --help


TargetOption = Annotated[
    str,
    typer.Option(
        "--target",
        help="kvspec (its own engine), or a real engine: "
        + "; ".join(f"{t.name}: {t.title}, only {t.faked} faked" for t in TARGETS)
        + " (each in its own venv: make sglang-env, make vllm-env).",
    ),
]
TargetPython = Annotated[
    str | None,
    typer.Option(
        "--target-python",
        "--sglang-python",
        "--vllm-python",
        help="A real target's interpreter: another release's venv, or one with your own "
        "checkout installed (default: $KVSPEC_SGLANG_PYTHON / $KVSPEC_VLLM_PYTHON, else the "
        "target's venv).",
    ),
]
TargetVersion = Annotated[
    str | None,
    typer.Option(
        "--target-version",
        "--sglang-version",
        help="The release to check, for a target with one venv per release "
        "(sglang-scheduler: make sglang-env SGLANG_VERSION=V; default 0.5.23).",
    ),
]


def chosen_target(name: str, also: tuple[str, ...] = ("kvspec",)) -> str:
    """``name`` if it is a target (the registry's, or one of ``also``); else the error that
    lists them (one line, exit 2)."""
    if name in also or name in NAMES:
        return name
    raise UnknownTarget(f"--target {name!r}: choose one of {', '.join((*also, *NAMES))}")


def target_options(python: str | None, version: str | None) -> TargetOptions:
    """What --target-python and --target-version picked."""
    return TargetOptions(python=None if python is None else str(python), version=version)


OutPath = Annotated[
    Path | None,
    typer.Option(help="Write the JSON here (default: stdout)."),
]

FormatOption = Annotated[
    Format,
    typer.Option(
        "--format", help="table (fits the terminal) | plain (tab-separated, one row a line) | json."
    ),
]

CrossCheck = Annotated[
    bool,
    typer.Option(
        help="Run every fast path (incremental census, reused views, fused rules) beside its "
        "from-scratch evaluation; stop at the first disagreement (= $KVSPEC_CROSSCHECK=1)."
    ),
]


def use_crosscheck(on: bool) -> None:
    """Turn cross-check mode on for this process and the workers it starts."""
    if on:
        import os

        from engine.observe.crosscheck import ENV

        os.environ[ENV] = "1"


def int_list(text: str) -> list[int]:
    """``"8,32,128"`` → ``[8, 32, 128]``; a clear error for anything else."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{text!r}: expected positive integers")
    return values


def emit_json(result: object, out: Path | None) -> None:
    """Print ``result`` as JSON, or write it to ``out``."""
    import json

    text = json.dumps(result, indent=2)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text + "\n", encoding="utf-8")
