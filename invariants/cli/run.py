"""`kvspec run SPEC`: one scenario spec, one matrix cell of it (`--set AXIS=VALUE`), or its
matrix filtered by axis values (`--matrix`), checked."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from invariants.checking.loader import load_catalog
from invariants.cli.app import (
    CrossCheck,
    FormatOption,
    TargetOption,
    TargetPython,
    TargetVersion,
    app,
    chosen_target,
    target_options,
    use_crosscheck,
)
from invariants.terminal import Format, out_console

if TYPE_CHECKING:
    from invariants.scenarios.matrix import Cell
    from invariants.scenarios.spec import Spec
    from invariants.targets.registry import TargetOptions


SpecPath = Annotated[Path, typer.Argument(help="A scenario spec (specs/*.yaml).")]
Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override an engine field or a matrix axis: KEY=VALUE (attention=mla)."
    ),
]
Strict = Annotated[
    bool | None,
    typer.Option(
        help="Stop at the first violation (level 2), or record every violation (level 1); "
        "default: the target's own (2 on sglang-scheduler, 1 elsewhere)."
    ),
]
SaveTrace = Annotated[
    Path | None,
    typer.Option(help="Write the op trace the spec ran as JSON (replayable, shrinkable)."),
]
Matrix = Annotated[
    bool,
    typer.Option(
        help="Run the spec's matrix cells instead; each --set AXIS=VALUE then filters them."
    ),
]
Full = Annotated[bool, typer.Option(help="With --matrix: the full product, not all pairs.")]


@app.command("run")
def run_command(
    spec: SpecPath,
    set_: Sets = None,
    strict: Strict = None,
    save_trace: SaveTrace = None,
    target: TargetOption = "kvspec",
    target_python: TargetPython = None,
    target_version: TargetVersion = None,
    matrix: Matrix = False,
    full: Full = False,
    crosscheck: CrossCheck = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Run one scenario spec with the checker after every event; print the verdict table;
    exit 1 on a violation, an unmet goal, a failed response oracle or an engine error (2: the
    spec or a flag is invalid, or a real target has no venv)."""
    from invariants.scenarios.spec import load_spec, parse_overrides

    use_crosscheck(crosscheck)
    target = chosen_target(target)
    level = None if strict is None else 2 if strict else 1
    if matrix:
        raise typer.Exit(_run_matrix(spec, set_ or [], full, level or 1, fmt))
    loaded = load_spec(spec, parse_overrides(set_ or []))  # a SpecError: one line, exit 2
    replay = f"kvspec run {spec}{''.join(f' --set {s}' for s in set_ or [])}"
    if target != "kvspec":
        options = target_options(target_python, target_version)
        raise typer.Exit(_run_on_target(target, loaded, level, options, replay))
    raise typer.Exit(_run_on_kvspec(loaded, level or 1, save_trace, replay, fmt))


def _run_on_kvspec(
    loaded: Spec, level: int, save_trace: Path | None, replay: str, fmt: Format
) -> int:
    from invariants.cli.run_table import RunResult, print_runs
    from invariants.scenarios.runner import run_spec

    outcome = run_spec(loaded, load_catalog(), level=level)
    if save_trace is not None:
        outcome.trace.save(save_trace)
    return print_runs(out_console(), [RunResult(loaded.name, replay, outcome)], fmt)


def _run_on_target(
    name: str, spec: Spec, level: int | None, options: TargetOptions, replay: str
) -> int:
    """The spec on a real engine: 0 clean, 1 a finding, 2 a spec the target cannot express
    (said, never passed; no venv: kvspec's main says so, exit 2)."""
    from invariants.targets.registry import target
    from invariants.targets.run import run_spec
    from invariants.targets.text import outcome_lines, target_flags, unsupported_line

    outcome = run_spec(target(name), spec, load_catalog(), level, options=options)
    if outcome.unsupported:
        typer.echo(unsupported_line(spec.name, outcome), err=True)
        return 2
    for line in outcome_lines(spec.name, outcome, f"{replay} {target_flags(name, options)}"):
        typer.echo(line)
    return 0 if outcome.ok else 1


def _matching_cells(path: Path, sets: list[str], full: bool) -> list[Cell]:
    """The spec's cells (pairwise, or the product) whose value on every filtered axis is the
    one asked for (a cell's value on an axis its spec does not vary is the spec's own)."""
    from invariants.scenarios.matrix import spec_cells
    from invariants.scenarios.matrix_axes import AXIS_NAMES, axis_label, axis_values
    from invariants.scenarios.spec import SpecError, load_spec, parse_overrides

    filters = {key: axis_label(value) for key, value in parse_overrides(sets).items()}
    unknown = sorted(set(filters) - set(AXIS_NAMES))
    if unknown:
        raise SpecError(
            f"--matrix: --set filters cells by axis ({', '.join(AXIS_NAMES)}); "
            f"not an axis: {', '.join(unknown)}"
        )
    cells = spec_cells(load_spec(path), full)
    return [
        cell
        for cell in cells
        if all(
            axis_label(axis_values(cell.spec.engine.model_dump())[k]) == v
            for k, v in filters.items()
        )
    ]


def _run_matrix(path: Path, sets: list[str], full: bool, level: int, fmt: Format) -> int:
    """Each matching cell checked, in the verdict table, failures with their replay command:
    0 all passed, 1 one failed, 2 invalid spec or filter, or no cell matches."""
    from invariants.cli.run_table import RunResult, print_runs
    from invariants.scenarios.runner import run_spec
    from invariants.scenarios.spec import SpecError

    cells = _matching_cells(path, sets, full)
    if not cells:
        raise SpecError(f"{path}: no matrix cell matches {' '.join(sets)} (drop a --set)")
    catalog = load_catalog()
    results = [RunResult(c.name, c.replay, run_spec(c.spec, catalog, level=level)) for c in cells]
    return print_runs(out_console(), results, fmt)
