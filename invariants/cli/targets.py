"""`kvspec <engine> ...`: the real engines' own commands, one group per engine (`kvspec sglang`),
each command from its target's folder (the registry's ``commands`` module attaches them).

Keeps: the command line names no engine itself; a target with commands of its own brings them
by its registry entry, so adding an engine adds its group here without an edit.
"""

from __future__ import annotations

import importlib

import typer

from invariants.cli.app import PLAIN_HELP, app
from invariants.targets.registry import TARGETS


def _groups() -> None:
    groups: dict[str, typer.Typer] = {}
    for entry in TARGETS:
        if entry.commands is None:
            continue
        if entry.group not in groups:
            named = ", ".join(t.name for t in TARGETS if t.group == entry.group and t.commands)
            groups[entry.group] = typer.Typer(
                **PLAIN_HELP,
                help=f"{entry.engine}'s own commands (the {named} targets).",
                no_args_is_help=True,
            )
            app.add_typer(groups[entry.group], name=entry.group)
        importlib.import_module(entry.commands).register(groups[entry.group])


_groups()
