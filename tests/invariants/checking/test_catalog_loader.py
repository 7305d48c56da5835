"""The catalog loader: every malformed file fails at load with `path:line: [id] reason`."""

from __future__ import annotations

from pathlib import Path

import pytest

from invariants.checking.loader import CATALOG_DIR, CatalogError, lint, load_catalog, load_text

GOOD = """version: 1
invariants:
  - id: t.busy
    title: counters add up
    when: [step, idle]
    for_each: pools as p
    expr: p.free + p.request_owned == p.capacity
    message: "{p.name}: free={p.free}"
    fixtures:
      pass:
        event: step
        view: {pools: [{capacity: 4, free: 4}]}
      fail:
        event: step
        view: {pools: [{capacity: 4, free: 3}]}
"""


def write(tmp_path: Path, text: str, name: str = "cat.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line containing `needle`."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def load_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(CatalogError) as err:
        load_catalog([path])
    return str(err.value)


def test_good_catalog_loads(tmp_path: Path) -> None:
    """A well-formed file loads into compiled rules with their events and fixtures."""
    catalog = load_catalog([write(tmp_path, GOOD)])
    rule = catalog.get("t.busy")
    assert (
        rule.events == {"step", "idle"}
        and rule.var == "p"
        and set(rule.fixtures) == {"pass", "fail"}
    )
    assert rule.source.endswith("cat.yaml:3")


# (name, edit applied to GOOD, the line whose number the error must carry, reason fragment)
BROKEN = [
    (
        "unknown key",
        ("    title:", "    colour: red\n    title:"),
        "colour:",
        "[t.busy] unknown key 'colour'",
    ),
    ("bad event", ("[step, idle]", "[step, stepp]"), "when:", "[t.busy] when.1:"),
    ("unknown name", ("p.free +", "q.free +"), "expr:", "[t.busy] expr: col 1: unknown name 'q'"),
    (
        "unknown attribute",
        ("p.free +", "p.fre +"),
        "expr:",
        "[t.busy] expr: col 3: attribute 'fre' is not a view field",
    ),
    ("syntax error", ("== p.capacity", "== == p.capacity"), "expr:", "[t.busy] expr: col"),
    (
        "message hole",
        ("free={p.free}", "free={p.pop}"),
        "message:",
        "[t.busy] message: col 19: attribute 'pop' is not a view field",
    ),
    (
        "bad fixture key",
        ("{capacity: 4, free: 3}", "{capacity: 4, fre: 3}"),
        "fre: 3",
        "[t.busy] fixtures.fail.view.pools.0: unknown key 'fre' in PoolView",
    ),
    (
        "bad fixture value",
        ("{capacity: 4, free: 3}", "{capacity: four, free: 3}"),
        "four",
        "[t.busy] fixtures.fail.view.pools.0.capacity:",
    ),
    (
        "fixture event not subscribed",
        (
            "        event: step\n        view: {pools: [{capacity: 4, free: 3}]}",
            "        event: forward\n        view: {pools: [{capacity: 4, free: 3}]}",
        ),
        "event: forward",
        "[t.busy] fixtures.fail.event: 'forward' is not in when",
    ),
    (
        "missing key",
        ("    expr: p.free + p.request_owned == p.capacity\n", ""),
        "- id: t.busy",
        "[t.busy] missing key 'expr'",
    ),
    (
        "bad id",
        ("id: t.busy", "id: Busy"),
        "- id: Busy",
        "[Busy] id 'Busy' must be dotted lowercase",
    ),
    (
        "where without for_each",
        ("    for_each: pools as p\n", "    where: step > 0\n"),
        "where:",
        "[t.busy] where: where needs for_each",
    ),
    ("bad for_each", ("pools as p", "pools into p"), "for_each:", "[t.busy] for_each: col 1:"),
    (
        "negative for_steps",
        ("    title:", "    for_steps: -1\n    title:"),
        "for_steps:",
        "[t.busy] for_steps:",
    ),
    ("yaml syntax", ("    title: counters add up", "    title: [unclosed"), "when:", "[?] YAML:"),
    (
        "duplicate yaml key",
        ("    title: counters add up", "    title: a\n    title: b"),
        "title: b",
        "[?] YAML: duplicate key 'title'",
    ),
    ("bad version", ("version: 1", "version: 2"), "version:", "[?] version:"),
    (
        "non-scalar key",
        ("    title: counters add up", "    ? [a]\n    : 1\n    title: counters add up"),
        "? [a]",
        "[?] YAML: a mapping key must be a plain scalar",
    ),
]


@pytest.mark.parametrize(
    ("edit", "marker", "reason"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN]
)
def test_broken_entry_names_file_line_and_reason(
    tmp_path: Path, edit: tuple[str, str], marker: str, reason: str
) -> None:
    """Each kind of mistake is a CatalogError pointing at the offending line."""
    assert edit[0] in GOOD
    text = GOOD.replace(edit[0], edit[1], 1)
    message = load_error(tmp_path, text)
    expected = f"{tmp_path / 'cat.yaml'}:{line_of(text, marker)}: {reason}"
    assert expected in message, message


def test_duplicate_id_across_files_names_first_definition(tmp_path: Path) -> None:
    """An id defined twice fails at the second definition and names the first one."""
    first, second = write(tmp_path, GOOD, "a.yaml"), write(tmp_path, GOOD, "b.yaml")
    with pytest.raises(CatalogError) as err:
        load_catalog([first, second])
    assert str(err.value) == f"{second}:3: [t.busy] duplicate id (first at {first}:3)"


def test_directory_argument_loads_its_yaml_files(tmp_path: Path) -> None:
    """A folder path expands to its *.yaml files (sorted)."""
    write(tmp_path, GOOD, "a.yaml")
    write(tmp_path, GOOD.replace("t.busy", "t.other"), "b.yaml")
    assert load_catalog([tmp_path]).ids == ("t.busy", "t.other")


def test_lint_collects_every_error(tmp_path: Path) -> None:
    """lint reports all problems of all entries, not just the first."""
    broken = GOOD.replace("p.free +", "p.fre +").replace("free={p.free}", "{nope}")
    text = broken + GOOD.split("invariants:\n", 1)[1].replace("t.busy", "t.two").replace(
        "[step, idle]", "[stepp]"
    )
    errors = lint([write(tmp_path, text)])
    assert len(errors) == 3
    assert [e.split(": [")[1].split("]")[0] for e in errors] == ["t.busy", "t.busy", "t.two"]


def test_lint_runs_fixtures(tmp_path: Path) -> None:
    """A pass fixture that fails and a fail fixture that passes are both lint errors."""
    text = GOOD.replace("{capacity: 4, free: 4}", "{capacity: 4, free: 2}").replace(
        "{capacity: 4, free: 3}", "{capacity: 4, free: 4}"
    )
    path = write(tmp_path, text)
    errors = lint([path])
    assert errors == [
        f"{path}:{line_of(text, 'pass:')}: [t.busy] pass fixture fails: full: free=2",
        f"{path}:{line_of(text, 'fail:')}: [t.busy] fail fixture passes: "
        "the invariant did not fire",
    ]


def test_lint_reports_fixture_on_which_the_rule_raises(tmp_path: Path) -> None:
    """A rule that raises on its fixture is a lint error, not a crash."""
    text = GOOD.replace("p.free + p.request_owned == p.capacity", "p.free // (p.capacity - 4) == 0")
    errors = lint([write(tmp_path, text)])
    assert any("pass fixture: the rule raised: rule raised ZeroDivisionError" in e for e in errors)


def test_lint_hints_prev_fixture(tmp_path: Path) -> None:
    """A transition rule whose fail fixture lacks `prev` never fires; lint says why."""
    text = GOOD.replace("p.free + p.request_owned == p.capacity", "prev.step <= step")
    errors = lint([write(tmp_path, text)])
    assert errors[-1].endswith("(the rule reads prev: give the fixture a prev view)")


def test_fixtures_of_a_for_steps_rule_still_fire(tmp_path: Path) -> None:
    """Fixtures are evaluated past the `for_steps` grace, so a tolerant rule's fail fixture
    fires."""
    text = GOOD.replace("    title:", "    for_steps: 3\n    title:")
    assert lint([write(tmp_path, text)]) == []


def test_fixture_prev_is_loaded(tmp_path: Path) -> None:
    """A fixture's `prev` becomes the previous view the rule compares against."""
    text = GOOD.replace("p.free + p.request_owned == p.capacity", "prev.step <= step").replace(
        "        view: {pools: [{capacity: 4, free: 3}]}",
        "        view: {step: 1, pools: [{}]}\n        prev: {step: 2}",
    )
    assert lint([write(tmp_path, text)]) == []


def test_load_text_reports_label() -> None:
    """load_text labels errors with the given name."""
    with pytest.raises(CatalogError, match=r"^mem:7: \[t.busy\] expr: col 3"):
        load_text(GOOD.replace("p.free +", "p.fre +"), "mem")


def test_default_catalog_is_the_shipped_folder() -> None:
    """Without paths, load_catalog reads invariants/checking/catalog/*.yaml."""
    catalog = load_catalog()
    assert catalog.paths == tuple(str(p) for p in sorted(CATALOG_DIR.glob("*.yaml")))
    assert len(catalog) > 0
