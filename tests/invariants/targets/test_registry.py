"""The registry is the one list of real engines: each entry's adapter provides the protocol the
rest of kvspec reaches it through, the command line takes its choices from it, and a name
outside it is refused in one line naming the choices."""

from __future__ import annotations

import importlib

import pytest

from invariants.cli import main
from invariants.targets.registry import NAMES, TARGETS, UnknownTarget, target

PROTOCOL = ("open_driver", "unsupported", "config", "decoder", "notes")


@pytest.mark.parametrize("entry", TARGETS, ids=NAMES)
def test_every_targets_adapter_provides_the_protocol(entry):
    """The adapter has every function of the protocol (the explorer's two where the target
    explores); a target with commands of its own registers them."""
    adapter = entry.adapter()
    wanted = PROTOCOL + (("swarm", "label") if entry.explores else ())
    assert [name for name in wanted if not callable(getattr(adapter, name, None))] == []
    if entry.commands is not None:
        assert callable(importlib.import_module(entry.commands).register)


def test_names_are_unique_and_looked_up_by_name():
    assert len(set(NAMES)) == len(NAMES) and target("vllm").engine == "vLLM"
    with pytest.raises(UnknownTarget, match="choose one of kvspec, sglang"):
        target("trtllm")


def test_an_unknown_target_is_one_line_naming_the_choices(capsys):
    """`kvspec run --target NAME` takes the registry's names; another is exit 2, one line."""
    with pytest.raises(SystemExit) as exited:
        main(["run", "specs/radix-eviction.yaml", "--target", "trtllm"])
    printed = capsys.readouterr().err
    assert exited.value.code == 2 and printed.count("\n") == 1
    assert all(name in printed for name in ("kvspec", *NAMES))
