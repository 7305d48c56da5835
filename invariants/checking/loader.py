"""Catalog loader: YAML files → compiled rules; every problem reads `path:line: [id] reason`.

Keeps: a malformed catalog never loads — YAML syntax, schema, expression language, fixture
views and duplicate ids are all checked at load, and `lint` collects every error at once and
runs every invariant's pass and fail fixtures.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from engine.view import StateView
from invariants.checking.checker import run_fixture
from invariants.checking.rule import Fixture, Rule, RuleError, compile_rule
from invariants.checking.schema import CatalogFileSpec, InvariantSpec, build_view, unknown_view_keys

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"
Loc = tuple[str | int, ...]


class CatalogError(ValueError):
    """One or more catalog problems, one `path:line: [id] reason` line each."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


class LineDict(dict[Any, Any]):
    """A YAML mapping that remembers its own line and the line of each key (1-based)."""

    __slots__ = ("key_lines", "line")

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}


class _LineLoader(yaml.SafeLoader):
    """SafeLoader whose mappings are LineDicts; duplicate keys are errors."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    result = LineDict(node.start_mark.line + 1)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain scalar", key_node.start_mark
            )
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass(frozen=True, slots=True)
class Catalog:
    """The loaded invariants, in file order."""

    rules: tuple[Rule, ...]
    paths: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def get(self, rule_id: str) -> Rule:
        return next(r for r in self.rules if r.id == rule_id)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self.rules)


def read_yaml(text: str) -> Any:
    """Parse YAML into LineDicts (mappings that know their lines); raises yaml.YAMLError."""
    return yaml.load(text, Loader=_LineLoader)


def catalog_files(paths: Iterable[str | Path] | None = None) -> list[Path]:
    """The YAML files named by `paths` (directories expand to *.yaml); default: the catalog."""
    result: list[Path] = []
    for path in [Path(p) for p in (paths or [])] or [CATALOG_DIR]:
        result.extend(sorted(path.glob("*.yaml")) if path.is_dir() else [path])
    return result


def load_catalog(paths: Iterable[str | Path] | None = None) -> Catalog:
    """Load and compile catalog files; raise CatalogError listing every problem."""
    errors: list[str] = []
    files = catalog_files(paths)
    rules = _load_files(files, errors)
    if errors:
        raise CatalogError(errors)
    return Catalog(tuple(rules), tuple(str(f) for f in files))


@functools.cache
def shipped_catalog() -> Catalog:
    """The shipped catalog (invariants/checking/catalog/), loaded once per process: its rules are
    immutable, so every run in a process (and each worker, in its own) shares it."""
    return load_catalog()


def load_text(text: str, label: str = "<string>") -> Catalog:
    """Load one catalog from YAML text (tests, tools); raise CatalogError on any problem."""
    errors: list[str] = []
    rules = _load_source(label, text, errors, {})
    if errors:
        raise CatalogError(errors)
    return Catalog(tuple(rules), (label,))


def lint(paths: Iterable[str | Path] | None = None) -> list[str]:
    """Every load error plus every fixture that does not behave (pass passes, fail fails)."""
    errors: list[str] = []
    rules = _load_files(catalog_files(paths), errors)
    for rule in rules:
        errors.extend(fixture_errors(rule))
    return errors


def fixture_errors(rule: Rule) -> list[str]:
    """The pass fixture must raise no violation of `rule`, the fail fixture at least one."""
    errors: list[str] = []
    for kind, fixture in rule.fixtures.items():
        found = [v for v in run_fixture([rule], fixture) if v.invariant == rule.id]
        prefix = f"{fixture.source}: [{rule.id}] {kind} fixture"
        if any(v.kind == "error" for v in found):
            errors.append(f"{prefix}: the rule raised: {found[0].message}")
        elif kind == "pass" and found:
            errors.append(f"{prefix} fails: {found[0].message}")
        elif kind == "fail" and not found:
            hint = (
                " (the rule reads prev: give the fixture a prev view)"
                if rule.uses_prev and fixture.prev is None
                else ""
            )
            errors.append(f"{prefix} passes: the invariant did not fire{hint}")
    return errors


def _load_files(files: Sequence[Path], errors: list[str]) -> list[Rule]:
    seen: dict[str, str] = {}  # id → path:line of its first definition
    rules: list[Rule] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            errors.append(f"{path}:1: [?] cannot read: {exc.strerror or exc}")
            continue
        rules.extend(_load_source(str(path), text, errors, seen))
    return rules


def _load_source(label: str, text: str, errors: list[str], seen: dict[str, str]) -> list[Rule]:
    try:
        raw = yaml.load(text, Loader=_LineLoader)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        errors.append(f"{label}:{line}: [?] YAML: {exc.problem or exc}")
        return []
    except yaml.YAMLError as exc:
        errors.append(f"{label}:1: [?] YAML: {exc}")
        return []
    if not isinstance(raw, LineDict):
        errors.append(f"{label}:1: [?] a catalog is a mapping with 'version' and 'invariants'")
        return []
    try:
        CatalogFileSpec.model_validate(raw)
    except ValidationError as exc:
        errors.extend(_pydantic_errors(label, raw, exc, "?"))
        return []
    entries = [_load_entry(label, entry, errors, seen) for entry in raw["invariants"]]
    return [rule for rule in entries if rule is not None]


def _load_entry(label: str, entry: Any, errors: list[str], seen: dict[str, str]) -> Rule | None:
    if not isinstance(entry, LineDict):
        errors.append(f"{label}:{getattr(entry, 'line', 1)}: [?] an invariant is a mapping")
        return None
    found: list[str] = []
    rule = _entry_rule(label, entry, found, seen)
    # one entry's errors in file order, whichever stage found them
    errors.extend(sorted(found, key=lambda e: int(e[len(label) + 1 :].split(":", 1)[0])))
    return rule


def _entry_rule(
    label: str, entry: LineDict, errors: list[str], seen: dict[str, str]
) -> Rule | None:
    ident = entry["id"] if isinstance(entry.get("id"), str) else "?"
    try:
        spec = InvariantSpec.model_validate(entry)
    except ValidationError as exc:
        errors.extend(_pydantic_errors(label, entry, exc, ident))
        _salvage(label, entry, ident, errors)
        return None
    if spec.id in seen:
        line = entry.key_lines["id"]
        errors.append(f"{label}:{line}: [{spec.id}] duplicate id (first at {seen[spec.id]})")
        return None
    seen[spec.id] = f"{label}:{entry.line}"
    fixtures = _fixtures(label, entry, spec, errors)
    try:
        rule = compile_rule(spec, fixtures, source=f"{label}:{entry.line}")
    except RuleError as exc:
        errors.extend(_rule_errors(label, entry, spec.id, exc))
        return None
    return rule if fixtures is not None else None


def _rule_errors(label: str, entry: LineDict, ident: str, exc: RuleError) -> list[str]:
    return [
        f"{label}:{locate(entry, (field,))}: [{ident}] {field}: {reason}"
        for field, reason in exc.problems
    ]


def _salvage(label: str, entry: LineDict, ident: str, errors: list[str]) -> None:
    """After a schema error, still report expression and fixture-view errors of the entry."""
    texts = {k: entry.get(k) for k in ("for_each", "where", "expr", "message")}
    texts = {k: v for k, v in texts.items() if isinstance(v, str)}
    fields: dict[str, Any] = dict(
        id=ident,
        title="",
        when=[],
        for_each=texts.get("for_each"),
        where=texts.get("where"),
        expr=texts.get("expr", "True"),
        message=texts.get("message", "-"),
        origin=[],
        for_steps=0,
    )
    partial = InvariantSpec.model_construct(**fields)  # unvalidated: the entry failed that
    try:
        compile_rule(partial)
    except RuleError as exc:
        errors.extend(_rule_errors(label, entry, ident, exc))
    fixtures = entry.get("fixtures")
    for kind in ("pass", "fail"):
        raw = fixtures.get(kind) if isinstance(fixtures, dict) else None
        view = raw.get("view") if isinstance(raw, dict) else None
        if isinstance(view, dict):
            _view(label, entry, ident, ("fixtures", kind, "view"), view, "step", errors)


def _fixtures(
    label: str, entry: LineDict, spec: InvariantSpec, errors: list[str]
) -> dict[str, Fixture] | None:
    result: dict[str, Fixture] = {}
    for kind, fspec in (("pass", spec.fixtures.pass_), ("fail", spec.fixtures.fail)):
        loc: Loc = ("fixtures", kind)
        if fspec.event not in spec.when:
            errors.append(
                f"{label}:{locate(entry, loc + ('event',))}: [{spec.id}] "
                f"fixtures.{kind}.event: {fspec.event!r} is not in when {spec.when}"
            )
            continue
        view = _view(label, entry, spec.id, loc + ("view",), fspec.view, fspec.event, errors)
        prev = (
            None
            if fspec.prev is None
            else _view(label, entry, spec.id, loc + ("prev",), fspec.prev, fspec.event, errors)
        )
        if view is not None and (prev is not None or fspec.prev is None):
            result[kind] = Fixture(fspec.event, view, prev, f"{label}:{locate(entry, loc)}")
    return result if len(result) == 2 else None


def _view(
    label: str,
    entry: LineDict,
    ident: str,
    loc: Loc,
    data: dict[str, Any],
    event: str,
    errors: list[str],
) -> StateView | None:
    unknown = [(loc + sub, reason) for sub, reason in unknown_view_keys(data)]
    for where, reason in unknown:
        errors.append(f"{label}:{locate(entry, where)}: [{ident}] {_dotted(where[:-1])}: {reason}")
    if unknown:
        return None
    try:
        return build_view(data, event)
    except ValidationError as exc:
        errors.extend(_pydantic_errors(label, entry, exc, ident, prefix=loc))
        return None


def locate(raw: Any, loc: Sequence[str | int]) -> int:
    """The line of the deepest key of `loc` present in `raw` (else its mapping's line)."""
    node, line = raw, getattr(raw, "line", 1)
    for key in loc:
        if isinstance(node, LineDict):
            if key not in node:
                return line
            line, node = node.key_lines.get(key, line), node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
            line = getattr(node, "line", line)
        else:
            break
    return line


def _pydantic_errors(
    label: str, raw: Any, exc: ValidationError, ident: str, prefix: Loc = ()
) -> list[str]:
    result = []
    for err in exc.errors():
        loc = prefix + tuple(err["loc"])
        result.append(f"{label}:{locate(raw, loc)}: [{ident}] {_reason(err, loc)}")
    return result


def _reason(err: Any, loc: Loc) -> str:
    where = f" in {_dotted(loc[:-1])}" if loc[:-1] else ""
    if err["type"] == "extra_forbidden":
        return f"unknown key '{loc[-1]}'{where}"
    if err["type"] == "missing":
        return f"missing key '{loc[-1]}'{where}"
    if loc == ("id",) and err["type"] == "string_pattern_mismatch":
        return f"id {err['input']!r} must be dotted lowercase, like pool.busy_sum"
    got = repr(err.get("input"))
    return f"{_dotted(loc)}: {err['msg']} (got {got[:60]})"


def _dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc)
