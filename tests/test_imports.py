"""No import cycles inside ``omp``: read from the import statements, function-local and
``TYPE_CHECKING`` imports included (a cycle hidden in a function is still a design knot)."""

from __future__ import annotations

import ast
from pathlib import Path

import omp

ROOT = Path(omp.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    origin = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    origin = node.module or ""
                for alias in node.names:
                    # ``from pkg import module`` imports the module; ``from mod import name``
                    # the module that defines it.
                    full = f"{origin}.{alias.name}"
                    targets.add(full if full in modules else origin)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert cycles(import_graph()) == []


def test_the_checker_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    graph = import_graph()
    assert "omp.rpc.commands" in graph["omp.rpc.server"]  # the parser sees real imports


def function_local_imports() -> list[tuple[str, int, str]]:
    """(module, line, imported module) for every import inside a function body."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    found = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    found += [(name, node.lineno, alias.name) for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = package.split(".")
                    if node.level:
                        base = base[:len(base) - node.level + 1]
                        target = ".".join([*base, *([node.module] if node.module else [])])
                    else:
                        target = node.module or ""
                    found.append((name, node.lineno, target))
    return found


def test_function_local_imports_are_only_the_listed_heavy_ones() -> None:
    from omp.lazy import LAZY_IMPORTERS, LAZY_MODULES

    def listed(target: str) -> bool:
        return any(target == lazy or target.startswith(lazy + ".") for lazy in LAZY_MODULES)

    unlisted = [f"{module}:{line}: {target}" for module, line, target in function_local_imports()
                if module not in LAZY_IMPORTERS and not listed(target)]
    assert unlisted == []
    # The list stays honest: every entry is still imported lazily somewhere.
    used = {target for _, _, target in function_local_imports()}
    assert [lazy for lazy in LAZY_MODULES
            if not any(t == lazy or t.startswith(lazy + ".") for t in used)] == []
