"""`kvspec run SPEC`: one scenario spec, one matrix cell of it (`--set AXIS=VALUE`), or its
matrix filtered by axis values (`--matrix`), checked."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from invariants.checking.loader import load_catalog
from invariants.cli.app import CrossCheck, FormatOption, app, use_crosscheck
from invariants.report.terminal import Format, out_console

if TYPE_CHECKING:
    from invariants.scenarios.matrix import Cell
    from invariants.scenarios.spec import Spec


class Target(str, Enum):
    """What a spec runs on."""

    kvspec = "kvspec"
    sglang = "sglang"
    sglang_scheduler = "sglang-scheduler"
    vllm = "vllm"


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
        help="Stop at the first violation (level 2; the default on sglang-scheduler), or "
        "record every violation (level 1; the default elsewhere)."
    ),
]
SaveTrace = Annotated[
    Path | None,
    typer.Option(help="Write the op trace the spec ran as JSON (replayable, shrinkable)."),
]
TargetOption = Annotated[
    Target,
    typer.Option(
        help="kvspec's engine; sglang: real SGLang's memory classes under kvspec's glue; "
        "sglang-scheduler: real SGLang's Scheduler and event loop, only the forward faked; "
        "vllm: vLLM v1's real Scheduler and KV cache manager, only the runner faked."
    ),
]
SGLangVersion = Annotated[
    str | None,
    typer.Option(help="sglang-scheduler: the release to check (default 0.5.23)."),
]
SGLangPython = Annotated[
    Path | None,
    typer.Option(help="The sglang venv's python (default: $KVSPEC_SGLANG_PYTHON, .sglang-venv)."),
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
    target: TargetOption = Target.kvspec,
    sglang_python: SGLangPython = None,
    sglang_version: SGLangVersion = None,
    matrix: Matrix = False,
    full: Full = False,
    crosscheck: CrossCheck = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Run one scenario spec with the checker after every event; print the verdict table;
    exit 1 on a violation, an unmet goal, a failed response oracle or an engine error (2: the
    spec or a flag is invalid)."""
    from invariants.scenarios.spec import load_spec, parse_overrides

    level = 2 if strict or (strict is None and target is Target.sglang_scheduler) else 1
    use_crosscheck(crosscheck)
    if matrix:
        raise typer.Exit(_run_matrix(spec, set_ or [], full, level, fmt))
    loaded = load_spec(spec, parse_overrides(set_ or []))  # a SpecError: one line, exit 2
    if target is Target.sglang:
        raise typer.Exit(_run_on_sglang(loaded, level, sglang_python))
    if target is Target.vllm:
        raise typer.Exit(_run_on_vllm(loaded, level))
    if target is Target.sglang_scheduler:
        raise typer.Exit(
            _run_on_scheduler(loaded, spec, set_ or [], level, sglang_version, sglang_python)
        )
    replay = f"kvspec run {spec}{''.join(f' --set {s}' for s in set_ or [])}"
    raise typer.Exit(_run_on_kvspec(loaded, level, save_trace, replay, fmt))


def _run_on_kvspec(
    loaded: Spec, level: int, save_trace: Path | None, replay: str, fmt: Format
) -> int:
    from invariants.cli.run_table import RunResult, print_runs
    from invariants.scenarios.runner import run_spec

    outcome = run_spec(loaded, load_catalog(), level=level)
    if save_trace is not None:
        outcome.trace.save(save_trace)
    return print_runs(out_console(), [RunResult(loaded.name, replay, outcome)], fmt)


def _run_on_sglang(spec: Spec, level: int, python: Path | None) -> int:
    """The spec on real SGLang (invariants/targets/sglang/): 0 clean, 1 a finding, 2 no sglang env or
    a spec the adapter does not model (said, never passed silently)."""
    from invariants.cli.sglang import print_outcome
    from invariants.targets.sglang.run import run_spec_on_sglang
    from invariants.targets.sglang.target import SGLangUnavailable

    try:
        outcome = run_spec_on_sglang(
            spec, load_catalog(), level, None if python is None else str(python)
        )
    except SGLangUnavailable as exc:
        typer.echo(f"sglang target: {exc}", err=True)
        return 2
    return print_outcome(spec.name, outcome)


def _run_on_vllm(spec: Spec, level: int) -> int:
    """The spec on vLLM's real scheduler (invariants/targets/vllm/): 0 clean, 1 a finding, 2 no vllm
    env or a spec vLLM has no counterpart for (said, never passed)."""
    from invariants.cli.sglang import print_outcome
    from invariants.targets.vllm.run import run_spec_on_vllm
    from invariants.targets.vllm.target import VLLMUnavailable

    try:
        outcome = run_spec_on_vllm(spec, load_catalog(), level)
    except VLLMUnavailable as exc:
        typer.echo(f"vllm target: {exc}", err=True)
        return 2
    return print_outcome(spec.name, outcome, "vllm")


def _run_on_scheduler(
    loaded: Spec, path: Path, sets: list[str], level: int, version: str | None, python: Path | None
) -> int:
    """The spec on SGLang's real scheduler (invariants/targets/sglang_scheduler/)."""
    from invariants.cli.scheduler import replay_flags, run_on_scheduler

    replay = f"kvspec run {path}{''.join(f' --set {s}' for s in sets)} {replay_flags(version)}"
    return run_on_scheduler(loaded, replay, level, version, None if python is None else str(python))


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
