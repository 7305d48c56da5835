"""The kvspec side of the sglang target, without sglang: interpreter choice, views, gaps,
what the glue refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from invariants.checking.loader import load_catalog
from invariants.scenarios.ops import FlushCache, ForceRetract, Step, Submit, Trace
from invariants.scenarios.spec import EngineSpec, load_spec
from invariants.targets.driver import TargetUnavailable
from invariants.targets.ops import output_rng, submit_message, with_outputs
from invariants.targets.registry import TargetOptions, target
from invariants.targets.run import run_spec
from invariants.targets.sglang.adapter import ENV_VAR, open_driver, sglang_python, unsupported
from invariants.targets.sglang.gaps import declared
from invariants.targets.views import to_state_view


def test_interpreter_order_is_flag_then_env_then_default(monkeypatch):
    """--target-python wins over $KVSPEC_SGLANG_PYTHON, which wins over .sglang-venv."""
    monkeypatch.setenv(ENV_VAR, "/env/python")
    assert sglang_python("/flag/python") == Path("/flag/python")
    assert sglang_python() == Path("/env/python")
    monkeypatch.delenv(ENV_VAR)
    assert sglang_python().parts[-3:] == (".sglang-venv", "bin", "python")


def test_missing_interpreter_is_a_clear_error(tmp_path):
    """A missing sglang python names the path and `make sglang-env`."""
    with pytest.raises(TargetUnavailable, match="make sglang-env"):
        open_driver(TargetOptions(python=str(tmp_path / "nope" / "python")))


def test_census_is_computed_from_the_raw_owners():
    """A page owned by the tree and by a request row is a duplicate; a page nobody owns and
    not free is an orphan — computed on the kvspec side from the driver's raw ids."""
    raw = {
        "event": "step",
        "pools": [
            {
                "name": "full",
                "capacity": 4,
                "free": 1,
                "census_input": {
                    "num_pages": 4,
                    "free_pages": [4],
                    "owned": [["tree:n1", [1, 2]], ["req:r1@row1", [2]]],
                    "referenced": [],
                },
            }
        ],
    }
    census = to_state_view(raw).pools[0].census
    assert [d.page for d in census.duplicates] == [2] and census.orphans == (3,)


def test_unknown_view_key_is_rejected():
    """A driver view with a key engine/view.py does not know is an error naming it."""
    with pytest.raises(ValueError, match="bogus"):
        to_state_view({"event": "idle", "pools": [], "bogus": 1})


def test_ops_and_features_the_glue_cannot_run_are_named():
    """force_retract, flush_cache and engine features the glue does not reproduce make a
    trace unsupported, each with its reason; SWA hybrid and plain ops are supported."""
    ops = [
        Submit(rid="r", input_ids=[1, 2], max_new_tokens=2),
        Step(),
        ForceRetract(),
        FlushCache(),
    ]
    reasons = unsupported(Trace(engine=EngineSpec(cache="chunk", test_retract=True), ops=ops))
    assert [r.split(":")[0] for r in reasons] == [
        "cache",
        "test_retract",
        "flush_cache",
        "force_retract",
    ]
    assert unsupported(Trace(engine=EngineSpec(swa_tokens=64, sliding_window=8), ops=ops[:2])) == []


def test_a_spec_with_an_unsupported_op_is_reported_not_run():
    """session-timeouts.yaml flushes the cache: the outcome names flush_cache as the reason it
    did not run, before any sglang process starts (so this runs without the sglang venv)."""
    outcome = run_spec(
        target("sglang"),
        load_spec("specs/session-timeouts.yaml"),
        load_catalog(),
        options=TargetOptions(python="/nonexistent/python"),
    )
    assert not outcome.ok and any("flush_cache" in why for why in outcome.unsupported)


def test_output_ids_are_a_seeded_draw_of_the_requested_length():
    """The model-less glue's output ids: max_new_tokens draws from the trace's seed."""
    message = submit_message(Submit(rid="r", input_ids=[1], max_new_tokens=5))
    first, again = with_outputs(message, output_rng(7)), with_outputs(message, output_rng(7))
    assert len(first["output_ids"]) == 5 and first == again


def test_a_gap_declares_only_a_sum_preserving_difference():
    """eviction.amount declares free/evictable moves only when free + evictable agree."""
    ours = {"free": 10, "evictable": 20, "session_held": 0, "request_owned": 0}
    assert (
        declared(ours, {**ours, "free": 0, "evictable": 30}, "free", {"page_size": 1}) is not None
    )
    assert declared(ours, {**ours, "free": 0}, "free", {"page_size": 1}) is None


def test_swa_window_gap_is_only_for_the_swa_pool_and_only_releases():
    """swa.window_only_at_checkpoint (0.5.23 frees out-of-window SWA KV at a checkpoint)
    declares an SWA-pool move from protected to free when the four buckets keep their sum,
    in an SWA hybrid only; never in the full pool, never SGLang holding more than kvspec."""
    ours = {"free": 1508, "evictable": 0, "protected": 528, "session_held": 0, "request_owned": 12}
    theirs = {**ours, "free": 1940, "protected": 96}
    hybrid = {"page_size": 4, "sliding_window": 32}
    gap = declared(ours, theirs, "protected", hybrid, pool="swa")
    assert gap is not None and gap.id == "swa.window_only_at_checkpoint"
    assert declared(ours, theirs, "protected", hybrid, pool="full") is None
    assert declared(ours, theirs, "protected", {"page_size": 4}, pool="swa") is None
    assert declared(theirs, ours, "protected", hybrid, pool="swa") is None  # SGLang holds more
    assert (
        declared(ours, {**theirs, "free": 1900}, "protected", hybrid, pool="swa") is None
    )  # a leak


def test_branch_insert_gap_moves_full_pool_tokens_to_request_owned_only():
    """swa.branch_insert_stops_at_live_window: in an SWA hybrid's full pool, SGLang may keep
    prompt tokens request-owned that kvspec has inserted (same sum), not the reverse."""
    ours = {"free": 2244, "evictable": 0, "protected": 804, "session_held": 0, "request_owned": 24}
    theirs = {**ours, "protected": 624, "request_owned": 204}
    hybrid = {"page_size": 4, "sliding_window": 32}
    assert (
        declared(ours, theirs, "request_owned", hybrid).id
        == "swa.branch_insert_stops_at_live_window"
    )
    assert declared(theirs, ours, "request_owned", hybrid) is None
    assert declared(ours, theirs, "request_owned", {"page_size": 4}) is None


def test_gaps_sharing_buckets_declare_a_joint_move():
    """Two gaps that move at once over shared buckets (an SWA session turn: window release and
    a borrowed row) declare it jointly when the union of their buckets keeps its sum."""
    ours = {"free": 7904, "evictable": 0, "protected": 256, "session_held": 0, "request_owned": 32}
    theirs = {**ours, "free": 7968, "protected": 192, "session_held": 32, "request_owned": 0}
    config = {"page_size": 4, "sliding_window": 32, "sessions": True}
    gap = declared(ours, theirs, "free", config, pool="swa")
    assert gap is not None and set(gap.id.split("+")) == {
        "swa.window_only_at_checkpoint",
        "session.borrowed_row_is_request_owned",
    }
    assert declared(ours, {**theirs, "free": 7900}, "free", config, pool="swa") is None


def test_swa_cadence_gap_only_lets_sglang_rows_keep_more_swa():
    """swa.eviction_cadence (0.5.23 frees a row's out-of-window SWA only every 128 slid tokens,
    0.5.11 every window's decode steps) declares an SWA-pool move from free to the rows
    (session_held, request_owned) that keeps their sum: never in the full pool, never without
    a sliding window, never a sum that does not balance, never SGLang's tree holding more."""
    ours = {"free": 7648, "evictable": 0, "protected": 256, "session_held": 0, "request_owned": 288}
    theirs = {**ours, "free": 7516, "session_held": 420, "request_owned": 0}
    hybrid = {"page_size": 4, "sliding_window": 32, "sessions": True}
    gap = declared(ours, theirs, "free", hybrid, pool="swa")
    assert gap is not None and "swa.eviction_cadence" in gap.id.split("+")
    assert declared(ours, theirs, "free", hybrid, pool="full") is None
    assert declared(ours, theirs, "free", {"page_size": 4, "sessions": True}, pool="swa") is None
    assert declared(ours, {**theirs, "free": 7500}, "free", hybrid, pool="swa") is None  # a leak
    alone = {"page_size": 4, "sliding_window": 32}  # no session: no borrowed row moves with it
    ours, theirs = (
        {**ours, "session_held": 288, "request_owned": 0},
        {**theirs, "session_held": 420},
    )
    assert declared(ours, theirs, "free", alone, pool="swa").id == "swa.eviction_cadence"
    tree = {**theirs, "session_held": 288, "protected": 256 + 132}  # SGLang's tree holds more
    assert declared(ours, tree, "free", alone, pool="swa") is None


def test_swa_cadence_and_window_gaps_move_jointly_in_a_session_turn():
    """At a session turn's first decode SGLang's tree holds one window less (window_only) while
    its slot still holds the slid-out tokens (cadence): declared jointly when the pool's sum
    holds and SGLang's tree part does not grow; a tree that holds more is a finding."""
    ours = {"free": 7648, "evictable": 0, "protected": 256, "session_held": 0, "request_owned": 288}
    theirs = {**ours, "free": 7580, "protected": 192, "session_held": 420, "request_owned": 0}
    config = {"page_size": 4, "sliding_window": 32, "sessions": True}
    gap = declared(ours, theirs, "protected", config, pool="swa")
    assert gap is not None and {"swa.window_only_at_checkpoint", "swa.eviction_cadence"} <= set(
        gap.id.split("+")
    )
    grown = {**theirs, "free": 7516, "protected": 256 + 64, "session_held": 356}
    assert declared(ours, grown, "protected", config, pool="swa") is None
