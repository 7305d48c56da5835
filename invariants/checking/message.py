"""A rule's message: a template with ``{expr}`` holes (``{{`` and ``}}`` are literal braces),
each hole an expression of the language of dsl.py, and the short rendering of the values the
holes show (census witnesses, records, long sequences).

Keeps: a hole is validated like any expression (same names, same attributes), and rendering
never raises — a hole that fails renders as ``<expr: ErrorType>`` — so a message can never
crash the checker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.view import NodeView, PageOwners, PoolView, ReqView, StateView, is_record, record_fields
from invariants.checking.dsl import DslError, Expr, compile_expr

MAX_SHOWN = 8  # elements of a sequence shown in a rendered message


@dataclass(frozen=True, slots=True, eq=False)
class Template:
    """A message with `{expr}` holes (`{{` and `}}` are literal braces), compiled once."""

    source: str
    parts: tuple[str | Expr, ...]

    @property
    def reads(self) -> frozenset[str]:
        return frozenset().union(*(p.reads for p in self.parts if isinstance(p, Expr)))

    @property
    def attrs(self) -> frozenset[str]:
        return frozenset().union(*(p.attrs for p in self.parts if isinstance(p, Expr)))

    def render(self, env: dict[str, Any]) -> str:
        return "".join(p if isinstance(p, str) else _render_hole(p, env) for p in self.parts)


def _render_hole(part: Expr, env: dict[str, Any]) -> str:
    try:
        return render_value(part(env))
    except Exception as exc:  # a message must never crash the checker
        return f"<{part.source.strip()}: {type(exc).__name__}>"


def compile_template(source: str, names: Iterable[str], label: str = "message") -> Template:
    """Split `source` into literal text and validated holes; raise DslError with the column."""
    declared = frozenset(names)
    parts: list[str | Expr] = []
    text: list[str] = []
    i = 0
    while i < len(source):
        char, pair = source[i], source[i : i + 2]
        if pair in ("{{", "}}"):
            text.append(char)
            i += 2
        elif char == "}":
            raise DslError(f"col {i + 1}: single '}}' in message (write '}}}}')")
        elif char == "{":
            end = _closing_brace(source, i)
            if text:
                parts.append("".join(text))
                text = []
            parts.append(compile_expr(source[i + 1 : end], declared, offset=i + 1, label=label))
            i = end + 1
        else:
            text.append(char)
            i += 1
    if text:
        parts.append("".join(text))
    return Template(source, tuple(parts))


def _closing_brace(source: str, start: int) -> int:
    depth = 0
    for j in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[j], 0)
        if depth == 0:
            return j
    raise DslError(f"col {start + 1}: unclosed '{{' in message")


def render_value(value: Any) -> str:
    """A short human rendering: census witnesses read 'page 7 owned by tree:n3, req:r1@row2'."""
    if isinstance(value, PageOwners):
        return f"page {value.page} owned by {', '.join(value.owners) or 'nobody'}"
    if is_record(value):  # before sequences: a ReqView is a (named) tuple
        return _short(value)
    if isinstance(value, (tuple, list, set, frozenset)):
        return _render_sequence(value)
    return str(value)


def _render_sequence(value: tuple[Any, ...] | list[Any] | set[Any] | frozenset[Any]) -> str:
    items = list(value)
    if isinstance(value, (set, frozenset)):
        try:
            items.sort()
        except TypeError:
            pass  # mixed types keep iteration order
    shown = [render_value(x) for x in items[:MAX_SHOWN]]
    more = f" … (+{len(items) - MAX_SHOWN} more)" if len(items) > MAX_SHOWN else ""
    if items and all(isinstance(x, PageOwners) for x in items[:MAX_SHOWN]):
        return "; ".join(shown) + more
    return "[" + ", ".join(shown) + more + "]"


def _short(value: Any) -> str:
    if isinstance(value, PoolView):
        return f"pool {value.name}"
    if isinstance(value, NodeView):
        return f"node {value.id}"
    if isinstance(value, ReqView):
        return f"req {value.rid or '?'}@row{value.req_pool_idx}"
    if isinstance(value, StateView):
        return f"view(step {value.step}, {value.event})"
    first = record_fields(value)[0]
    return f"{type(value).__name__}({first}={getattr(value, first)!r})"
