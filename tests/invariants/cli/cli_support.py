"""Run the `kvspec` console script in process, as a user's shell does (``invariants.cli.main``:
one-line errors, exit codes), at a given terminal width or as a pipe."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from invariants.cli import main


@dataclass(frozen=True, slots=True)
class Ran:
    code: int
    out: str
    err: str


def kvspec(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    *args: str,
    columns: int | None = None,
) -> Ran:
    """``kvspec ARGS`` with ``$COLUMNS`` = ``columns`` (None: a pipe, no width given)."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out, err = capsys.readouterr()
    code = exited.value.code
    return Ran(code if isinstance(code, int) else 1, out, err)
