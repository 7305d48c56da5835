"""The bug zoo's record types: a ``Mutant`` (one historical bug, planted by swapping one engine
function for its pre-fix body) and a ``FalsePositive`` (a checker bug: the pre-fix formula,
as rules, fires on the correct engine where the shipped catalog must not).

A ``Planted`` entry is a bug whose precondition no op trace reaches in kvspec's engine:
the zoo builds the state by hand (invariants/mutants/planted.py) and the catalog judges it.

Keeps: a mutant's patch is one swap (``swap``) that restores the engine on exit, so a mutant
never outlives its run; a trigger is a file under specs/bugs/ (a scenario spec, ``.yaml``,
or an op trace, ``.json``) and nothing else; every entry can fail — none is reported as a
known gap that passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

if TYPE_CHECKING:
    from engine.view import StateView

BUGS_DIR = Path(__file__).resolve().parents[2] / "specs" / "bugs"
Patch = Callable[[], AbstractContextManager[Any]]
PlantedViews = list[tuple[str, "StateView"]]  # (event, view) pairs, checked in order


@contextmanager
def swap(owner: Any, name: str, replacement: Any, *also: tuple[Any, str, Any]) -> Iterator[None]:
    """Replace ``owner.name`` (a method, a module function) for the ``with`` block. ``also``
    names the other sites of the same change when one fix touched two functions (#22651)."""
    with ExitStack() as stack:
        for target, attr, new in ((owner, name, replacement), *also):
            stack.enter_context(mock.patch.object(target, attr, new))
        yield


@dataclass(frozen=True, slots=True)
class Mutant:
    """One historical bug as a switchable engine mutant.

    ``expect``: the invariant ids that name it (any of them at the first violating event
    counts as caught). ``catalog_off``: rules left out of the run because they catch a
    different, earlier symptom that the trigger's own shape provokes (rarely needed).
    ``probe_rules``: for a bug with no state effect any invariant could see (lock churn), a
    rules file under specs/bugs/ that watches the fix's postcondition on this trigger; it
    runs beside the catalog, clean run included (kind "probe").
    """

    name: str
    issue: str
    summary: str
    patch: Patch
    trigger: str  # file name under specs/bugs/
    expect: frozenset[str]
    catalog_off: frozenset[str] = frozenset()
    probe_rules: str = ""  # file name under specs/bugs/; empty: the shipped catalog alone

    @property
    def kind(self) -> str:
        return "probe" if self.probe_rules else "mutant"

    @property
    def trigger_path(self) -> Path:
        return BUGS_DIR / self.trigger

    @property
    def probe_rules_path(self) -> Path | None:
        return BUGS_DIR / self.probe_rules if self.probe_rules else None


@dataclass(frozen=True, slots=True)
class FalsePositive:
    """A checker bug: ``old_rules`` (a rules file under specs/bugs/, the pre-fix formula)
    is evaluated on the same views as the shipped catalog while the correct engine runs
    ``trigger``. Caught = the old rules fire (``expect`` among them) and the catalog is
    silent (docs/design.md decision 11)."""

    name: str
    issue: str
    summary: str
    old_rules: str  # file name under specs/bugs/
    trigger: str
    expect: frozenset[str]
    kind: str = "false_positive"

    @property
    def trigger_path(self) -> Path:
        return BUGS_DIR / self.trigger

    @property
    def old_rules_path(self) -> Path:
        return BUGS_DIR / self.old_rules


@dataclass(frozen=True, slots=True)
class Planted:
    """A bug no op trace reaches in kvspec's engine (``why``): ``plant(bug)`` builds the
    state and returns the (event, view) pairs to check — the fixed code's with ``bug``
    False (must be clean), the bug's with True. Caught = an ``expect`` invariant fires at
    the first violating view. ``catalog_off``: rules whose event the planted view is taken
    at by construction (a request between its trim and its release), as for a mutant."""

    name: str
    issue: str
    summary: str
    plant: Callable[[bool], PlantedViews]
    expect: frozenset[str]
    why: str
    catalog_off: frozenset[str] = frozenset()
    kind: str = "planted"
    trigger: str = ""  # no trigger file: the state is built by ``plant``


Entry = Mutant | FalsePositive | Planted


def ids(*names: str) -> frozenset[str]:
    return frozenset(names)


__all__ = [
    "BUGS_DIR",
    "Entry",
    "FalsePositive",
    "Mutant",
    "Patch",
    "Planted",
    "PlantedViews",
    "ids",
    "swap",
]
