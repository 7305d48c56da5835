"""The bug zoo (invariants/mutants, `kvspec bugs`): every historical SGLang bug of
docs/sglang.md §5 is caught — a mutant on its trigger by its expected invariant (a probe
rule for the one with no state effect), a planted state (no trace reaches the bug in kvspec)
by the catalog on the views it builds; every trigger and every planted fixed state is clean;
every checker false positive is the old formula's, never the catalog's; nothing passes as a
known gap: an entry that is not caught makes `kvspec bugs` exit 1."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import invariants.mutants as zoo
from invariants.checking.loader import Catalog, lint, load_catalog
from invariants.cli import app
from invariants.mutants import BUGS_DIR, ZOO, FalsePositive, Mutant, Planted, entry
from invariants.mutants.hunt import check_views, hunt, load_trigger, run_rules
from invariants.scenarios.trace_run import run_trace

CATALOG = load_catalog()
MUTANTS = [e for e in ZOO if isinstance(e, Mutant)]
PLANTED = [e for e in ZOO if isinstance(e, Planted)]
FALSE_POSITIVES = [e for e in ZOO if isinstance(e, FalsePositive)]
TRACED = [e for e in ZOO if not isinstance(e, Planted)]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda e: e.name)
def test_each_mutant_is_caught_by_its_expected_invariant(mutant: Mutant) -> None:
    """Under the mutant, an expected invariant fires at the first violating event."""
    found = hunt(mutant, CATALOG)
    assert found.status == "caught", (
        f"{mutant.name}: {found.status} {found.caught_by} {found.detail}"
    )
    assert set(found.caught_by) & mutant.expect and found.step >= 0


@pytest.mark.parametrize("zoo_entry", TRACED, ids=lambda e: e.name)
def test_each_trigger_is_clean_without_its_mutant(zoo_entry: Mutant | FalsePositive) -> None:
    """The trigger alone violates nothing (probe rules included): a catch is the mutant's,
    not the workload's."""
    rules = run_rules(zoo_entry, CATALOG) if isinstance(zoo_entry, Mutant) else CATALOG
    outcome = run_trace(load_trigger(zoo_entry.trigger_path), rules)
    assert outcome.ok, outcome.describe()


@pytest.mark.parametrize("planted", PLANTED, ids=lambda e: e.name)
def test_each_planted_state_is_caught_and_its_fixed_state_clean(planted: Planted) -> None:
    """A planted entry: the fixed code's state violates nothing; the bug's state is caught
    by an expected invariant at the first violating view; the reason no trace reaches the
    bug is given."""
    assert check_views(planted.plant(False), run_rules(planted, CATALOG)) == ()
    found = hunt(planted, CATALOG)
    assert found.status == "caught", (
        f"{planted.name}: {found.status} {found.caught_by} {found.detail}"
    )
    assert set(found.caught_by) & planted.expect and len(planted.why) > 40


def test_the_probe_entry_needs_its_probe() -> None:
    """The chunk-stash bug leaves a consistent state: the shipped catalog alone does not see
    it (docs/sglang.md §5 #20476 (3)), so only its probe rule catches it."""
    probe = entry("20476-chunk-stash-through-tree")
    assert isinstance(probe, Mutant) and probe.kind == "probe"
    assert hunt(replace(probe, probe_rules=""), CATALOG).status == "missed"


@pytest.mark.parametrize("fp", FALSE_POSITIVES, ids=lambda e: e.name)
def test_false_positive_fires_the_old_formula_not_the_catalog(fp: FalsePositive) -> None:
    """The pre-fix checker formula fires on the correct engine (so the scenario is the one
    that misled SGLang); the shipped catalog, watching the same views, does not."""
    found = hunt(fp, CATALOG)
    assert found.status == "caught", found.detail
    assert set(found.caught_by) == set(fp.expect)


def test_registry_files_exist_and_old_rules_lint() -> None:
    """Every trigger, old-rules and probe-rules file lives under specs/bugs/; those rules
    pass lint (each has a passing and a failing fixture); every expected id exists."""
    assert len({e.name for e in ZOO}) == len(ZOO)
    for e in TRACED:
        assert e.trigger_path.parent == BUGS_DIR and e.trigger_path.exists(), e.trigger
    for path in [fp.old_rules_path for fp in FALSE_POSITIVES] + [
        m.probe_rules_path for m in MUTANTS if m.probe_rules
    ]:
        assert path is not None and path.parent == BUGS_DIR and lint([path]) == []
    for e in [*MUTANTS, *PLANTED]:
        assert e.expect <= set(run_rules(e, CATALOG).ids), e.name


def test_patch_is_undone_after_the_run() -> None:
    """A mutant's swap lasts for its ``with`` block only."""
    from engine.cache.streaming_session import StreamingSession

    real = StreamingSession.match_request
    with entry("20070-unaligned-protected").patch():
        assert StreamingSession.match_request is not real
    assert StreamingSession.match_request is real


def test_cli_exit_codes(tmp_path: Path) -> None:
    """`kvspec bugs --only X`: 0 when X is caught (JSON written), 2 for an unknown name."""
    out = tmp_path / "zoo.json"
    runner = CliRunner()
    ok = runner.invoke(
        app,
        [
            "bugs",
            "--only",
            "22651-bonus-lag",
            "--only",
            "22213-busy-double-count",
            "--no-shrink",
            "--json",
            str(out),
        ],
    )
    assert ok.exit_code == 0, ok.output
    rows = json.loads(out.read_text())
    assert [r["status"] for r in rows] == ["caught", "caught"] and rows[0]["caught_by"] == [
        "spec.overalloc_bounded"
    ]
    assert runner.invoke(app, ["bugs", "--only", "no-such-bug"]).exit_code == 2


def test_cli_fails_when_a_mutant_is_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant whose expected invariant does not fire makes `kvspec bugs` exit 1."""
    broken = replace(entry("22651-bonus-lag"), expect=frozenset({"tree.page_aligned"}))
    monkeypatch.setitem(zoo.BY_NAME, broken.name, broken)
    result = CliRunner().invoke(app, ["bugs", "--only", broken.name, "--no-shrink"])
    assert result.exit_code == 1 and "1 failing" in " ".join(result.output.split())


def test_cli_fails_when_a_planted_state_is_not_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted entry the catalog does not catch (here: the catalog emptied) makes `kvspec
    bugs` exit 1, as a missed mutant does; with the catalog it exits 0."""
    runner = CliRunner()
    args = ["bugs", "--only", "22900-swa-cursor-uncapped", "--no-shrink"]
    assert runner.invoke(app, args).exit_code == 0
    monkeypatch.setattr("invariants.mutants.zoo.load_catalog", lambda: Catalog(()))
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "missed" in result.output


def test_a_yaml_triggers_expect_goals_are_checked_on_the_clean_run(tmp_path: Path) -> None:
    """A .yaml trigger's ``expect`` is a claim about its clean run (it reaches the scenario):
    one the clean run falls short of fails the row, naming the goal, before the mutant runs."""
    mutant = entry("retract-inserts-kv")
    assert isinstance(mutant, Mutant) and mutant.trigger.endswith(".yaml")
    text = mutant.trigger_path.read_text().replace(
        "expect: {retracted_reqs: 1}", "expect: {retracted_reqs: 100000}"
    )
    (tmp_path / "weak.yaml").write_text(text)
    found = hunt(replace(mutant, trigger=str(tmp_path / "weak.yaml")), CATALOG)
    assert found.status == "weak-trigger" and not found.ok
    assert "retracted_reqs >= 100000" in found.detail
