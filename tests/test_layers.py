"""The architecture's layering, held by the code itself: no import circle anywhere in the
project, and no upward import — a module imports its own layer and the layers below it,
never one above (docs/design.md §2: ``kernels`` ← ``engine`` ← ``invariants``, refined below). Every
import counts: module level, inside a function, and under ``if TYPE_CHECKING:``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "engine", "invariants")

# Bottom first. A module belongs to the longest prefix that names it ("=name": that module
# alone, not its subpackages).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("kernels",),
    ("=engine", "engine.errors", "engine.view", "engine.view_blocks", "engine.hooks"),
    ("engine.config", "engine.request"),
    ("engine.mem",),  # page math, allocators, request rows, KV tensors, change feeds
    ("engine.cache",),  # prefix caches, the streaming-session cache and its slots
    ("engine.memory",),  # the wired stack and the KV lifecycle
    ("engine.model",),  # the scheduler → model contract, sim and tiny models
    ("engine.speculative",),  # EAGLE: a decode policy over memory and model
    ("engine.sched",),  # the scheduler, handed a decode policy
    ("engine.observe",),  # the state view: reads everything below, writes nothing
    ("engine.session_api", "engine.engine"),  # the facade that wires the components
    ("engine.server",),
    # catalog → compiled rules → per-event checker; how results print; the machine they ran on
    ("=invariants", "invariants.checking", "invariants.terminal", "invariants.machine"),
    ("invariants.checked_server",),  # `kvspec serve`'s app: an engine with the checker attached
    ("invariants.scenarios",),  # specs → op traces → checked runs
    ("invariants.fleet",),  # workers (local, Ray actors) and the journal that survives a kill
    ("invariants.explore",),  # seeds, coverage, shrinking, replay on kvspec's engine
    # the real engines: the engine-neutral core, then one folder per engine, then the registry's
    # users (the core reaches a folder only through registry.Target.adapter(), at run time)
    ("invariants.targets", "invariants.targets.driverlib"),
    ("invariants.targets.sglang", "invariants.targets.sglang_scheduler", "invariants.targets.vllm"),
    ("invariants.targets.sglang_server",),  # the real server over the scheduler target's venvs
    ("invariants.campaigns",),  # `kvspec campaign`: targets × releases × budgets, one table
    ("invariants.bench",),  # speed: kvspec's engine, the kernels, the real targets
    ("invariants.report", "invariants.mutants"),  # report → target rows; mutants → explore
    ("invariants.cli",),
    ("invariants.pytest_plugin",),
)
# Run in a real engine's venv: import nothing of the project.
ISOLATED = (
    "invariants.targets.driverlib",
    "invariants.targets.sglang.driver",
    "invariants.targets.sglang_scheduler.driver",
    "invariants.targets.sglang_server.driver",
    "invariants.targets.vllm.driver",
)


def modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, module) for every project module ``name`` imports, wherever the import is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            module = _known_prefix(target, known)
            if module is not None and module != name:
                yield node.lineno, module


def _known_prefix(target: str, known: dict[str, Path]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def layer_of(name: str) -> int:
    best, index = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix.startswith("=")
            prefix = prefix.lstrip("=")
            named = name == prefix or (not exact and name.startswith(prefix + "."))
            if named and len(prefix) > best:
                best, index = len(prefix), i
    return index


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {m for _, m in imports_of(name, path, known)} for name, path in known.items()}


def test_every_module_has_a_layer() -> None:
    """The table above places every module (a new package is placed deliberately)."""
    assert [name for name in modules() if layer_of(name) < 0] == []


def test_no_upward_import() -> None:
    """No module imports a module of a higher layer."""
    known, upward = modules(), []
    for name, path in known.items():
        for line, target in imports_of(name, path, known):
            if layer_of(target) > layer_of(name):
                upward.append(f"{path.relative_to(ROOT)}:{line} {name} -> {target}")
    assert upward == []


def test_no_import_circle() -> None:
    """The import graph of the project's modules has no cycle (strongly connected component
    of more than one module, or a module importing itself)."""
    assert cycles(graph()) == []


def test_isolated_modules_import_nothing_of_the_project() -> None:
    """A driver runs in its engine's own venv: it imports no project module but drivers'."""
    known, found = modules(), []
    for name, path in known.items():
        if name.startswith(ISOLATED):
            found += [
                f"{name} -> {t}"
                for _, t in imports_of(name, path, known)
                if not t.startswith(ISOLATED)
            ]
    assert found == []


def test_only_the_sglang_targets_name_or_import_sglang() -> None:
    """Everything SGLang-specific lives in targets/sglang*: no other module is named after it
    or imports one of those (the rest reaches them through the registry), and none imports
    sglang itself."""
    known, found = modules(), []
    inside = (
        "invariants.targets.sglang",
        "invariants.targets.sglang_scheduler",
        "invariants.targets.sglang_server",
    )
    for name, path in known.items():
        if name.startswith(inside):
            continue
        if "sglang" in path.name:
            found.append(f"{path.relative_to(ROOT)}: named after SGLang")
        found += [
            f"{path.relative_to(ROOT)}:{line} imports {target}"
            for line, target in imports_of(name, path, known)
            if target.startswith(inside)
        ]
        found += [f"{path.relative_to(ROOT)} imports sglang" for _ in _imports_sglang(path)]
    assert found == []


def _imports_sglang(path: Path) -> Iterator[ast.AST]:
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if any(n == "sglang" or n.startswith("sglang.") for n in names):
            yield node


def test_the_checks_find_what_they_look_for() -> None:
    """A cycle and an upward edge planted in a toy graph are found (the checks can fail)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("engine.mem.allocator") < layer_of("engine.cache.radix_cache")
    assert layer_of("engine.observe.census") > layer_of("engine.sched.scheduler")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with a cycle (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found
