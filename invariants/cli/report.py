"""`kvspec report`: the main job (`make report`)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from invariants.cli.app import CrossCheck, FormatOption, app, use_crosscheck
from invariants.report.terminal import Format


class ReportTarget(str, Enum):
    kvspec = "kvspec"
    sglang = "sglang"
    both = "both"
    sglang_scheduler = "sglang-scheduler"
    vllm = "vllm"
    all = "all"


OutDir = Annotated[
    Path, typer.Option(help="Folder for report.json, junit.xml, report.md, report.html.")
]
Full = Annotated[
    bool, typer.Option(help="Every combination of the matrix axes, not just every pair.")
]
Workers = Annotated[
    int | None, typer.Option(min=1, help="Local worker processes (default: one per CPU).")
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        help="Run the cells on Ray instead: a cluster address, or 'local' "
        "(needs the kvspec\\[ray] extra)."
    ),
]
Target = Annotated[
    ReportTarget,
    typer.Option(
        help="kvspec's engine; sglang: every spec as written on kvspec and on real SGLang's "
        "memory classes, side by side; both: the kvspec report plus that; sglang-scheduler: "
        "the side by side on SGLang's real scheduler (level 2); vllm: on vLLM v1's real "
        "scheduler (make vllm-env); all: every spec on kvspec and the three real-engine "
        "targets, one column each."
    ),
]
SGLangPython = Annotated[
    str | None,
    typer.Option(help="The sglang venv's python (default: $KVSPEC_SGLANG_PYTHON, .sglang-venv)."),
]

SGLangVersion = Annotated[
    str | None, typer.Option(help="sglang-scheduler: the release (its venv; default 0.5.23).")
]


@app.command()
def report(
    out: OutDir = Path("report"),
    full: Full = False,
    workers: Workers = None,
    ray_address: RayAddress = None,
    target: Target = ReportTarget.kvspec,
    sglang_python: SGLangPython = None,
    sglang_version: SGLangVersion = None,
    crosscheck: CrossCheck = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Run every spec, matrix cell and memory-layer cell under the checker (level 1); print
    the verdict, the failures and the summary, write the report files; exit 1 on any failure
    (sglang target: a violation or crash), 2 when a backend or the sglang target is missing."""
    from invariants.report.backends import BackendError
    from invariants.report.run import default_workers, run_report
    from invariants.targets.sglang_scheduler.target import ShimDrift
    from invariants.targets.sglang.target import SGLangUnavailable
    from invariants.targets.vllm.target import VLLMUnavailable

    use_crosscheck(crosscheck)
    try:
        code = run_report(
            out=out,
            full=full,
            workers=workers or default_workers(),
            ray_address=ray_address,
            target=target.value,
            sglang_python=sglang_python,
            sglang_version=sglang_version,
            fmt=fmt,
        )
    except ShimDrift as exc:
        typer.echo(f"shim drift: {exc}", err=True)
        raise typer.Exit(2) from None
    except (BackendError, SGLangUnavailable, VLLMUnavailable) as exc:
        named = {SGLangUnavailable: "sglang target: ", VLLMUnavailable: "vllm target: "}
        typer.echo(f"{named.get(type(exc), '')}{exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)
