"""ReqView is a NamedTuple (cheap to build by the hundred per step) that keeps the view
contract of the dataclass it replaced: same fields and defaults (in the order of the one field
list it is built from: the fields copied from the Req, then the derived ones); rendered as a
mapping of field to value; named field by field in YAML fixture errors and witnesses; and an
unchanged request keeps handing out the very same view object through the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import EngineConfig, MemoryConfig
from engine.engine import Engine
from engine.observe.req_views import ReqViewCache
from engine.request import SamplingParams
from engine.view import ReqView, StateView, is_record, record_fields, view_field_names, view_to_dict
from invariants.checking.loader import CatalogError, load_catalog
from invariants.checking.message import render_value

# The dataclass-era contract: every field with its default (fixtures name only the fields
# they test and rely on the rest), in the order of the one field list (engine/view.py).
DEFAULTS = {
    "rid": "",
    "kv_committed_len": 0,
    "kv_allocated_len": 0,
    "cache_protected_len": 0,
    "swa_evicted_seqlen": 0,
    "is_chunked": 0,
    "kv_committed_freed": False,
    "kv_overallocated_freed": False,
    "is_retracted": False,
    "req_pool_idx": -1,
    "seq_len": 0,
    "origin_len": 0,
    "num_output": 0,
    "finished": False,
    "to_finish": False,
    "in_waiting": False,
    "in_running": False,
    "in_batch": False,
    "spec_seq_len": -1,
    "spec_accept_len": 0,
}


def test_fields_order_and_defaults_are_the_dataclass_ones() -> None:
    """ReqView() has every field at its documented default, in the documented order, and
    its fields are view fields an invariant may name."""
    assert is_record(ReqView) and is_record(ReqView())
    assert record_fields(ReqView) == tuple(DEFAULTS)
    assert view_to_dict(ReqView()) == DEFAULTS
    assert set(DEFAULTS) <= view_field_names()


def test_a_request_renders_as_a_mapping_not_a_list() -> None:
    """In a view's plain data (JSON reports, replay diffs) a request is field -> value."""
    view = StateView(reqs=(ReqView(rid="r1", req_pool_idx=2, seq_len=7),))
    data = json.loads(json.dumps(view_to_dict(view)))
    assert data["reqs"] == [{**DEFAULTS, "rid": "r1", "req_pool_idx": 2, "seq_len": 7}]


def test_a_witness_names_the_request() -> None:
    """A ReqView witness reads 'req r1@row2', alone or in a list, not as a tuple of values."""
    first, second = ReqView(rid="r1", req_pool_idx=2), ReqView(rid="r2")
    assert render_value(first) == "req r1@row2"
    assert render_value((first, second)) == "[req r1@row2, req r2@row-1]"


def test_replace_sets_the_named_fields_only() -> None:
    """``_replace`` (EAGLE's annotate) gives a ReqView differing in the named fields only."""
    view = ReqView(rid="r1", seq_len=5)
    spec = view._replace(spec_seq_len=4, spec_accept_len=2)
    assert type(spec) is ReqView and spec.spec_seq_len == 4 and spec.spec_accept_len == 2
    assert spec._replace(spec_seq_len=-1, spec_accept_len=0) == view


REQ_RULE = """version: 1
invariants:
  - id: t.reqs
    title: committed within allocated
    when: [step]
    for_each: reqs as r
    expr: r.kv_committed_len <= r.kv_allocated_len
    message: "{r}: committed {r.kv_committed_len}"
    fixtures:
      pass:
        event: step
        view: {reqs: [{rid: r1, kv_committed_len: 3, kv_allocated_len: 4}]}
      fail:
        event: step
        view: {reqs: [{rid: r1, kv_committed_len: 5, kv_allocated_len: 4}]}
"""


def test_yaml_fixtures_build_req_views(tmp_path: Path) -> None:
    """A fixture's ``reqs: [{rid: r1, ...}]`` builds ReqViews with the named fields set."""
    path = tmp_path / "reqs.yaml"
    path.write_text(REQ_RULE)
    fail = load_catalog([path]).get("t.reqs").fixtures["fail"].view.reqs
    assert (
        fail == (ReqView(rid="r1", kv_committed_len=5, kv_allocated_len=4),)
        and type(fail[0]) is ReqView
    )


def test_an_unknown_request_field_names_file_line_and_field(tmp_path: Path) -> None:
    """A misspelt request field in a fixture fails at load with path:line, the field, and
    ReqView's field list."""
    text = REQ_RULE.replace("kv_committed_len: 5", "kv_comitted_len: 5")
    path = tmp_path / "reqs.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError) as err:
        load_catalog([path])
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "kv_comitted_len" in s)
    message = str(err.value)
    assert (
        f"{path}:{line}: [t.reqs] fixtures.fail.view.reqs.0: "
        "unknown key 'kv_comitted_len' in ReqView" in message
    )
    assert "(fields: rid, kv_committed_len, kv_allocated_len," in message


@pytest.mark.parametrize("overlap", [True, False])
def test_an_unchanged_request_keeps_its_view_object(overlap: bool) -> None:
    """Between two views with nothing changed every request's view is the same object; after
    a step the changed ones are new and equal to a fresh build, the others still the same."""
    engine = Engine(EngineConfig(memory=MemoryConfig(max_total_tokens=256), enable_overlap=overlap))
    for k in range(3):
        engine.submit([1, 2, 3, k], SamplingParams(max_new_tokens=6, ignore_eos=True))
    engine.step()
    engine.step()
    first = engine.state_view("step").reqs
    again = engine.state_view("step").reqs
    assert len(first) == 3 and all(a is b for a, b in zip(first, again, strict=True))
    engine.step()
    after = engine.state_view("step").reqs
    kept = {v.rid: v for v in first}
    assert any(v is not kept[v.rid] for v in after)
    assert all(v is kept[v.rid] for v in after if v == kept[v.rid])
    assert after == ReqViewCache().views(engine.scheduler.live_reqs(), engine.views._places())
