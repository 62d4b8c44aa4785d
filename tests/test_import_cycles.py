"""No import cycle in env, agents, search or dashboard, lazy (function-level) imports included.

import-linter's layer contracts see only the arrows between the layers they name; a tie inside one
layer, or one hidden in a function body, passes them. This test reads every ``import`` and
``from ... import`` in the source with ``ast`` (at any depth; those under ``if TYPE_CHECKING:`` are
not run, so they are left out) and fails naming each cycle it finds: between two modules, or between
two folders (or a folder and a module) of one package, where a module in one imports a module in the
other and back.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("env", "agents", "search", "dashboard")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that runs, at any depth: the body of ``if TYPE_CHECKING:`` is skipped
    (its ``else`` branch runs, so it is read)."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports. ``from pkg import name`` counts as importing
    ``pkg.name`` where that is a module, else ``pkg``."""
    files = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _run_imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                           for alias in node.names]
            for target in targets:
                while target and target not in files:  # `import a.b.c` where c is a name, not a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle, as a closed path that starts and ends at its smallest name."""
    found: list[list[str]] = []

    def walk(start: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == start:
                found.append([*path, start])
            elif nxt > start and nxt not in path:
                walk(start, [*path, nxt])

    for start in sorted(graph):
        walk(start, [start])
    return found


def folder_graphs(graph: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """For each package, the graph of its direct children (subpackages and modules): one child
    imports another where any module in the one imports any module in the other. A cycle between
    modules shows in the graph of the package that holds them both, so these graphs hold every tie."""
    packages = {name.rpartition(".")[0] for name in graph} | {name for name in graph if "." not in name}
    graphs: dict[str, dict[str, set[str]]] = {}
    for package in sorted(p for p in packages if p):
        prefix = package + "."

        def child(module: str) -> str | None:
            return prefix + module[len(prefix):].split(".")[0] if module.startswith(prefix) else None

        children: dict[str, set[str]] = {}
        for module, imported in graph.items():
            if (source := child(module)) is None:
                continue
            children.setdefault(source, set()).update(
                target for target in map(child, imported) if target is not None and target != source)
        graphs[package] = children
    return graphs


def ties(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every import cycle between the children of one package, as ``package: a -> b -> a``."""
    return [f"{package}: " + " -> ".join(name[len(package) + 1:] for name in path)
            for package, children in folder_graphs(import_graph(root, packages)).items()
            for path in cycles(children)]


def test_no_import_cycle():
    found = ties()
    assert not found, f"{len(found)} import cycle(s); move what both sides need below them:\n" + "\n".join(found)


def test_a_lazy_import_cycle_is_found(tmp_path):
    pkg = tmp_path / "env"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from env.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n    return g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from env.a import g\n")
    (pkg / "d.py").write_text("import env.c\n")
    graph = import_graph(tmp_path, ("env",))
    assert graph["env.sub.b"] == {"env.a"} and graph["env.c"] == set() and graph["env.d"] == {"env.c"}
    assert cycles(graph) == [["env.a", "env.sub.b", "env.a"]]
    assert ties(tmp_path, ("env",)) == ["env: a -> sub -> a"]
