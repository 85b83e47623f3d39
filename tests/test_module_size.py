"""Every module under ``jask/`` fits in 400 lines, and every function in 80 unless its docstring says why.

A file that size is one job a newcomer can read at once; a function that size
is one screen. A longer function must give its reason in its docstring, on a
line starting ``Long:`` (e.g. ``Long: the grid, BlockSpecs and kernel of one
pallas_call read best side by side``). Sources are read with ``ast``, nothing
is imported.
"""
from __future__ import annotations

import ast
import pathlib

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent / "jask"   # this checkout's, whatever is installed
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def long_modules(root: pathlib.Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    """``path: N lines`` for each ``.py`` file under ``root`` longer than ``limit`` lines."""
    out = []
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append(f"{path.relative_to(root.parent)}: {n} lines")
    return out


def _gives_reason(node) -> bool:
    doc = ast.get_docstring(node) or ""
    return any(line.strip().startswith("Long:") for line in doc.splitlines())


def long_functions(root: pathlib.Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (N lines)`` for each function over ``limit`` lines whose docstring gives no reason."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit and not _gives_reason(node):
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_every_module_is_at_most_400_lines():
    assert not long_modules(PACKAGE_DIR), "split these modules by job (see the folder's DESIGN.md)"


def test_every_long_function_says_why():
    assert not long_functions(PACKAGE_DIR), "split these functions, or give the reason in a 'Long:' docstring line"


def test_the_checks_catch_planted_files(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(85))
    (pkg / "big.py").write_text("\n" * 401)
    (pkg / "fn.py").write_text(f"def long():\n{body}\n\n\ndef said():\n    \"\"\"Long: a reason.\"\"\"\n{body}\n")
    assert long_modules(pkg) == ["pkg/big.py: 401 lines"]
    assert long_functions(pkg) == ["pkg/fn.py:1 long (86 lines)"]
