"""No import cycles among jask's modules.

The graph is read from the source with ``ast``, nothing is imported. Both kinds
of import count: those at module level AND those inside functions or methods
(an import moved into a function to dodge a cycle still ties the two modules
together, it only fails later). Imports under ``if TYPE_CHECKING:`` do not
count: they never run. A package's ``__init__`` running before its submodules
is not an edge (it would tie every module to ``jask/__init__.py``).

A cycle is a strongly connected component of more than one module, or a
module importing itself.
"""
from __future__ import annotations

import ast
import pathlib

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent / "jask"   # this checkout's, whatever is installed


def module_names(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root`` (the package ``package``)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join([package, *parts])] = path
    return names


def _under_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(tree: ast.AST, module: str, is_package: bool, modules):
    """Every module of ``modules`` that ``tree`` imports (module level and inside functions).

    ``from pkg import name`` imports ``pkg.name`` when that is a module, else ``pkg``.
    """
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _under_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    files = module_names(root, package)
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        targets = {t for t in imported_names(tree, name, is_package, files) if t in files}
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected components (Tarjan) of two or more modules, and self-imports."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = iter(range(len(graph) + 1))

    def visit(v):
        # Iterative Tarjan: recursion depth would follow the import chains.
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = next(counter)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_jask_has_no_import_cycles():
    found = cycles(import_graph(PACKAGE_DIR, "jask"))
    assert found == [], f"{len(found)} import cycle(s):\n" + "\n".join(" <-> ".join(c) for c in found)


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_counter_finds_a_planted_cycle(tmp_path):
    root = tmp_path / "planted"
    _write(root, {
        "__init__.py": "",
        "a.py": "from planted.b import f\n",
        "b.py": "def f():\n    from planted import c   # function level: still an edge\n",
        "c.py": "from . import a\n",                              # relative: resolved
        "clean.py": "import planted.a\n",                         # reaches the cycle, is not in it
        "typing_only.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted import clean\n",
        "sub/__init__.py": "from .leaf import g\n",
        "sub/leaf.py": "from planted.sub import g\n",              # a package and its submodule
    })
    found = cycles(import_graph(root, "planted"))
    assert found == [["planted.a", "planted.b", "planted.c"], ["planted.sub", "planted.sub.leaf"]]


def test_counter_on_a_clean_package(tmp_path):
    root = tmp_path / "clean"
    _write(root, {"__init__.py": "from clean.a import x\n", "a.py": "import os\nx = os.sep\n",
                  "b.py": "from clean import a\n"})
    assert cycles(import_graph(root, "clean")) == []


if __name__ == "__main__":   # print today's cycles: python tests/test_import_cycles.py
    for c in cycles(import_graph(PACKAGE_DIR, "jask")):
        print(len(c), " ".join(c))
