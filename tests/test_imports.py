"""No import cycle in cait/: every `import` and `from ... import`, at module level or inside a function, read
from the source (ast), relative ones resolved. A cycle through function-level imports works only as long as
each import runs late enough; it ties the modules into one, which the package's layering is meant to prevent.
Imports under `if TYPE_CHECKING:` never run (annotations only), so they are no edge. And the structure the code
keeps: no private name imported across modules, no class of the app over twelve methods."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cait"


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    """{dotted module name: file} of every module in the package (a package by its __init__.py)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a `from X import ...` names (`from .x`, `from ..`, `from cait.x`)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    anchor = package[: len(package) - node.level + 1]
    return ".".join(anchor + ([node.module] if node.module else []))


def _with_parents(target: str, importer: str, known: dict[str, Path]) -> set[str]:
    """`target` and the packages Python runs first to import it, except the importer's own packages (which are
    being imported already when it runs)."""
    parts = target.split(".")
    own = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 1)}
    return {n for n in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if n in known and n not in own}


def _run_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` except those under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return nodes


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of the package that `module` imports, anywhere in its code that runs."""
    found: set[str] = set()
    for node in _run_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path, node)
            # `from pkg import name` imports pkg, and pkg.name too when that is a module
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
        else:
            continue
        for target in targets:
            found |= _with_parents(target, module, known)
    found.discard(module)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None (depth-first search, colouring the nodes)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_reader_sees_function_level_and_relative_imports(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("def f():\n    from .sub import b\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "b.py").write_text("from .. import a\n")
    (root / "c.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .a import f\n")
    known = module_names(root)
    graph = {m: imports_of(m, p, known) for m, p in known.items()}
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.c"] == set()
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]


def test_no_import_cycle_in_the_package():
    known = module_names()
    graph = {module: imports_of(module, path, known) for module, path in known.items()}
    assert "cait.evaluate" in graph and graph["cait.evaluate"], "the graph reader found no imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# cait.evaluate is not here: its --help lists the explanation methods and corruptions, whose owners
# (cait.explain.methods, cait.corruptions) build them from torch functions.
@pytest.mark.parametrize("command", ["cait.data.export", "cait.data.products", "cait.atlas", "cait.compare"])
def test_a_commands_help_imports_no_torch(command):
    """`python -m COMMAND --help` answers without importing torch (seconds on a busy machine): its parser and
    the names its flags offer load first, the datasets and models only when the command runs."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{command!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_module({command!r}, run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "print('exit', code, 'torch', 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: python -m " + command in proc.stdout
    assert proc.stdout.rstrip().endswith("exit 0 torch False")


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore is its module's own: no module of the package, the app, the analysis
    scripts, the benchmarks or the maintenance scripts imports one from another module (a private module's
    public names, `from ._checks import check_input`, are fine)."""
    root = PACKAGE.parent
    found = []
    for folder in ("cait", "app", "analysis", "benchmarks", "scripts"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ImportFrom):
                    private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                    found += [f"{path.relative_to(root)}:{node.lineno} {name}" for name in private]
    assert not found, found


MAX_METHODS = 12  # a class with more does more than one thing (split it by what its methods share)


def methods_over(source: str, most: int = MAX_METHODS) -> list[str]:
    """The classes of `source` with more than `most` methods (functions defined in the class body), with their
    count."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            n = sum(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) for item in node.body)
            found += [f"{node.name} ({n})"] if n > most else []
    return found


def test_no_class_of_the_app_has_more_than_twelve_methods():
    """Each class of `app/` holds one concern: its methods (the defs of its body) number 12 at most."""
    many = "class Many:\n" + "".join(f"    def m{k}(self):\n        def inner(): pass\n" for k in range(13))
    assert methods_over(many) == ["Many (13)"] and methods_over(many, 13) == []  # nested defs do not count
    root = PACKAGE.parent
    found = {
        str(path.relative_to(root)): over
        for path in sorted((root / "app").rglob("*.py"))
        if (over := methods_over(path.read_text()))
    }
    assert not found, found
