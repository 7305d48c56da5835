"""The expression language: what it rejects at load, what it computes, and that it cannot mutate."""

from __future__ import annotations

import copy
import json
import types

import pytest

from engine.view import PageOwners, PoolView, ReqView, StateView, view_field_names
from invariants.checking.dsl import FUNCTIONS, DslError, compile_expr, make_env
from invariants.checking.loader import CatalogError, load_text
from invariants.checking.message import compile_template, render_value
from invariants.checking.rule import BASE_NAMES

NAMES = BASE_NAMES | {"x"}  # `x`: a declared for_each variable

# payloads a YAML author could try (attribute escapes, dunder walks, mutation), and the reason
# each must be refused
PAYLOADS = [
    ("__import__('os').getpid()", "col 1: call to '__import__' is not allowed"),
    ("().__class__.__base__.__subclasses__()", "col 4: attribute '__class__' is not a view field"),
    ("x.__class__", "col 3: attribute '__class__' is not a view field"),
    ("sum.__self__", "col 1: function 'sum' may only be called"),
    ("(lambda: 1)()", "col 1: call to a lambda is not allowed"),
    ("reqs.pop() is None", "col 1: call to method '.pop' is not allowed"),
    ("(s for s in reqs).gi_frame", "col 19: attribute 'gi_frame' is not a view field"),
    ("x.gi_frame.f_globals", "col 3: attribute 'gi_frame' is not a view field"),
    ("2 ** 100", "col 1: operator '**' is not allowed"),
    ("max(reqs, key=len)", "col 11: keyword arguments are not allowed"),
    ("sorted(*reqs)", "col 8: star expression is not allowed"),
    ("(y := 1)", "col 2: assignment expression ':=' is not allowed"),
    ("f'{reqs}'", "col 1: f-string is not allowed"),
    ("pools[0].free.real", "col 15: attribute 'real' is not a view field"),
    ("reqs is reqs", "col 1: 'is' / 'is not' may only compare with None"),
    ("{1: 2}", "col 1: dict display is not allowed"),
    ("10 / 3", "col 1: operator '/' is not allowed"),
    ("step << 2", "col 1: operator '<<' is not allowed"),
    ("~step", "col 1: operator '~' is not allowed"),
    ("b'x'", "col 1: constant of type bytes is not allowed"),
    ("open('f')", "col 1: call to 'open' is not allowed"),
    ("__builtins__", "col 1: unknown name '__builtins__'"),
    ("len", "col 1: function 'len' may only be called"),
    ("[r for r in reqs if sum(1 for r in pools)]", "col 31: comprehension variable 'r' shadows"),
    ("pools +", "syntax error"),
]


@pytest.mark.parametrize(("source", "reason"), PAYLOADS, ids=[p[0] for p in PAYLOADS])
def test_payload_rejected_with_construct_and_column(source: str, reason: str) -> None:
    """Every escape or mutation payload fails validation, naming the construct and its column."""
    with pytest.raises(DslError) as err:
        compile_expr(source, NAMES)
    assert reason in str(err.value)


@pytest.mark.parametrize("source", [p[0] for p in PAYLOADS[:13]])
def test_payload_rejected_at_catalog_load(source: str) -> None:
    """A payload in a catalog's `expr` is a load error of that invariant (no code runs)."""
    text = f"""version: 1
invariants:
  - id: t.payload
    title: payload
    when: [step]
    for_each: pools as x
    expr: {json.dumps(source)}
    message: m
    fixtures: {{pass: {{event: step, view: {{}}}}, fail: {{event: step, view: {{}}}}}}
"""
    with pytest.raises(CatalogError) as err:
        load_text(text, "p.yaml")
    assert str(err.value).startswith("p.yaml:7: [t.payload] expr: col ")


VIEW = StateView(
    step=3,
    page_size=4,
    pools=(
        PoolView(name="full", capacity=16, free=6, evictable=4, protected=2, request_owned=4),
        PoolView(name="swa", capacity=8, free=8),
    ),
    reqs=(
        ReqView(rid="a", kv_committed_len=5, kv_allocated_len=8),
        ReqView(rid="b", kv_committed_len=9, kv_allocated_len=9),
    ),
)

ALLOWED = [
    ("sum(p.free for p in pools)", 14),
    ("len(reqs) + 1", 3),
    ("all(r.kv_committed_len <= r.kv_allocated_len for r in reqs)", True),
    ("any(p.name == 'swa' for p in pools)", True),
    ("min(r.kv_allocated_len for r in reqs) - max(p.capacity for p in pools)", -8),
    ("sorted(set(r.rid for r in reqs))", ["a", "b"]),
    ("abs(-step) // 2 % 2", 1),
    ("[p.name for p in pools][1:]", ["swa"]),
    ("pools[-1].name", "swa"),
    ("{r.rid for r in reqs if r.kv_committed_len > 6}", {"b"}),
    ("'x' if step > 2 else 'y'", "x"),
    ("prev is None and 3 in (1, 2, 3) and 4 not in [1]", True),
    ("1 < step <= 3 != 4", True),
    ("sum(f for n, f in [(p.name, p.free) for p in pools])", 14),
    ("not reqs[0].kv_committed_freed and -step + +1 == -2", True),
    ("set(reqs[0:1]) - set(reqs)", set()),
    ("[0] * 3", [0, 0, 0]),
]


@pytest.mark.parametrize(("source", "expected"), ALLOWED, ids=[a[0] for a in ALLOWED])
def test_allowed_expression_evaluates(source: str, expected: object) -> None:
    """Allowed constructs compute what plain Python computes."""
    assert compile_expr(source, NAMES)(make_env(VIEW)) == expected


def test_evaluation_cannot_mutate_the_view() -> None:
    """Running every allowed expression leaves the view equal to a deep copy taken before."""
    before = copy.deepcopy(VIEW)
    for source, _ in ALLOWED:
        compile_expr(source, NAMES)(make_env(VIEW))
    assert VIEW == before


def test_evaluation_globals_have_no_builtins() -> None:
    """The evaluation environment exposes only the function table, the view names and prev."""
    env = make_env(VIEW)
    assert env["__builtins__"] == {}
    assert set(env) == {"__builtins__", "prev", *FUNCTIONS, *BASE_NAMES}


def test_no_view_field_names_a_builtin_attribute() -> None:
    """The attribute allow-list is safe only while no view field is also a method or attribute
    of a builtin value an expression can produce (int, str, tuple, set, generator, function)."""
    gen = (i for i in ())
    builtin_attrs = {
        a
        for obj in (
            0,
            0.0,
            "",
            (),
            [],
            set(),
            frozenset(),
            None,
            True,
            gen,
            sum,
            types.SimpleNamespace,
        )
        for a in dir(obj)
    }
    assert not view_field_names() & builtin_attrs


def test_reads_report_prev() -> None:
    """An expression's `reads` names the declared variables it uses (how prev rules are found)."""
    assert compile_expr("step > prev.step", NAMES).reads == {"step", "prev"}


def test_template_holes_and_escapes() -> None:
    """`{expr}` holes are filled; `{{`/`}}` are literal braces."""
    template = compile_template("{pools[0].name}: free={pools[0].free} {{raw}}", NAMES)
    assert template.render(make_env(VIEW)) == "full: free=6 {raw}"


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("free={pools[0].gi_frame}", "col 16: attribute 'gi_frame' is not a view field"),
        ("a {nope} b", "col 4: unknown name 'nope'"),
        ("a {pools", "col 3: unclosed '{'"),
        ("a } b", "col 3: single '}'"),
        ("x {} y", "col 4: empty expression"),
    ],
)
def test_template_errors_name_column_in_message(source: str, reason: str) -> None:
    """A bad hole is a DslError whose column counts from the start of the message."""
    with pytest.raises(DslError) as err:
        compile_template(source, NAMES)
    assert reason in str(err.value)


def test_template_hole_that_raises_renders_a_marker() -> None:
    """A failing hole renders `<expr: Error>` instead of crashing the checker."""
    template = compile_template("ratio={step // (len(reqs) - 2)}", NAMES)
    assert template.render(make_env(VIEW)) == "ratio=<step // (len(reqs) - 2): ZeroDivisionError>"


def test_render_value_names_pages_and_owners() -> None:
    """Census witnesses render as 'page N owned by A, B'; long lists are cut after 8."""
    dup = (PageOwners(7, ("tree:n3", "req:r1@row2")), PageOwners(9, ("req:r2@row3",)))
    assert render_value(dup) == "page 7 owned by tree:n3, req:r1@row2; page 9 owned by req:r2@row3"
    assert render_value(tuple(range(10))) == "[0, 1, 2, 3, 4, 5, 6, 7 … (+2 more)]"
    assert render_value(VIEW.reqs[0]) == "req a@row-1"
