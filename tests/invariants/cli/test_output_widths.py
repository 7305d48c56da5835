"""Output a person can read, at every width: a terminal 60, 100 or 200 columns wide, and a pipe
(no width given). An invariant id, a zoo entry, a cell name, a flag is never cut or wrapped
inside; a table too wide for the terminal turns into one record per block; the last line of a
checking command is its verdict. A user's mistake is one line on stderr, exit 2; a finding
exits 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import kvspec
from rich.console import Console

from invariants.checking.loader import load_catalog
from invariants.cli.app import app
from invariants.terminal import Col, Format, print_table

WIDTHS = [60, 100, 200, None]  # None: a pipe
SPEC = "specs/radix-eviction.yaml"


def whole(token: str, text: str) -> bool:
    """``token`` appears unbroken, not followed by an ellipsis (rich's cut)."""
    return token in text and f"{token[:-1]}…" not in text


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    return lambda *args, columns=None: kvspec(capsys, monkeypatch, *args, columns=columns)


@pytest.mark.parametrize("columns", WIDTHS)
def test_invariant_ids_are_whole(run, columns: int | None) -> None:
    """`kvspec invariants list`: every id of the catalog, whole, at every width."""
    result = run("invariants", "list", columns=columns)
    assert result.code == 0
    missing = [r.id for r in load_catalog() if not whole(r.id, result.out)]
    assert not missing
    if columns == 60:  # too narrow for the table: one record per invariant
        assert "  title: " in result.out and "┃" not in result.out
    if columns is None:  # a pipe: each invariant's row is one whole line, title included
        lines = result.out.splitlines()
        assert all(any(r.id in ln and r.title in ln for ln in lines) for r in load_catalog())


def _flags(command: str) -> list[str]:
    """Every flag name of a `kvspec` sub-command, from its click parameters."""
    import typer.main

    group = typer.main.get_command(app)
    params = group.commands[command].params
    return [opt for p in params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("--")]


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("command", ["serve", "run", "report"])
def test_help_never_cuts_a_flag(run, command: str, columns: int | None) -> None:
    """`--help` of the commands with the longest flags lists every flag whole."""
    result = run(command, "--help", columns=columns)
    assert result.code == 0
    cut = [flag for flag in _flags(command) if not whole(flag, result.out)]
    assert not cut


@pytest.mark.parametrize("columns", WIDTHS)
def test_run_prints_the_verdict_table_and_a_verdict_line(run, columns: int | None) -> None:
    """`kvspec run SPEC`: the cell's name whole in the table (or its record), then PASS."""
    result = run("run", SPEC, columns=columns)
    assert result.code == 0, result.out
    assert whole("radix-eviction", result.out) and "checks" in result.out
    last = result.out.rstrip().splitlines()[-1]
    assert last.startswith("PASS · 1/1 cells passed · ") and "0 violations" in last


@pytest.mark.parametrize("columns", [60, 100, 200])
def test_a_table_fits_or_becomes_records(columns: int) -> None:
    """Each printed line fits the width, wrapping only the text column at words; the long id
    stays whole on its own line when nothing fits."""
    cols = (Col("entry"), Col("issue", "text"), Col("seconds", "num"))
    entry = "session-radix-evicted-frontier-kept"
    issue = "issue 18 item 3a (sglang#29173 discard_deleted_session_leaf) " * 2
    console = Console(record=True, width=columns, color_system=None)
    print_table(console, cols, [[entry, issue, 20.3]], Format.table)
    text = console.export_text()
    assert whole(entry, text) and whole("discard_deleted_session_leaf", text)
    assert all(len(line) <= columns for line in text.splitlines())
    assert ("  issue: " in text) == (columns < 100)  # 60: a record per row


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "specs/nope.yaml"], "specs/nope.yaml: cannot read the spec"),
        (["run", "{dir}"], "cannot read the spec (Is a directory)"),
        (["run", SPEC, "--set", "attention=foo"], "--set attention=foo: not a value of the axis"),
        (["run", SPEC, "--set", "page_size=abc"], "--set page_size=abc"),
        (["run", SPEC, "--strictt"], "No such option: --strictt"),
        (["run", SPEC, "--format", "xml"], "'xml' is not one of"),
        (["run"], "Missing argument 'spec'"),
        (["bench", "serve", "--modes", "nope"], "modes 'nope': choose from"),
        (["bugs", "--only", "no-such-entry"], "no bug zoo entry 'no-such-entry'"),
    ],
)
def test_a_user_mistake_is_one_line_and_exit_2(
    run, tmp_path: Path, args: list[str], says: str
) -> None:
    """A missing or unreadable file, a spec that does not parse, an unknown axis value, a bad
    flag: one line on stderr naming it, no traceback, exit 2."""
    result = run(*[str(tmp_path) if a == "{dir}" else a for a in args])
    assert result.code == 2, (result.out, result.err)
    assert says in result.err and result.err.count("\n") == 1 and "Traceback" not in result.err


def test_a_spec_that_does_not_parse_names_its_line(run, tmp_path: Path) -> None:
    """YAML that does not parse: the file, the line, what is wrong — one line, exit 2."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nengine: [\n")
    result = run("run", str(bad))
    assert result.code == 2 and result.err.startswith(f"kvspec: {bad}:3: YAML error: ")


def test_debug_shows_the_traceback(run, tmp_path: Path) -> None:
    """`--debug` anywhere on the line re-raises the error instead of the one line."""
    from invariants.scenarios.spec import SpecError

    with pytest.raises(SpecError, match="cannot read the spec"):
        run("run", "specs/nope.yaml", "--debug")
