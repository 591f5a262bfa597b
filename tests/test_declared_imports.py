"""Every third-party import is declared in pyproject.toml, so that an install from it runs what it ships: the
`cait` package its core dependencies (and the `figures`, `atlas` and `compare` extras, which its drawing code, the
head atlas's parquet copies and the comparison's scipy import lazily), the app, analysis, benchmarks and scripts
the core and the extras, the tests also the `test` extra."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FOLDERS = ("analysis", "benchmarks", "scripts", "tests")
# this project's own modules: its packages, its folders (tests import scripts.ship_model), and the scripts'
# helpers imported from their folder (pyproject's pytest pythonpath puts analysis/ on the tests' path too)
OURS = {"cait", "app", *FOLDERS} | {p.stem for folder in FOLDERS for p in (ROOT / folder).glob("*.py")}

# scripts run in a venv of their own, not the project's (each says how in its docstring): what only they import
OWN_VENV = {"scripts/make_corruption_fixture.py": {"imagecorruptions"}}


def _names(requirements: list[str]) -> set[str]:
    """Distribution names of requirement strings, leaving out an extra that includes another of ours."""
    names = {canonicalize_name(Requirement(r).name) for r in requirements}
    return names - {canonicalize_name(PROJECT["name"])}


CORE = _names(PROJECT["dependencies"])
EXTRAS = {extra: _names(deps) for extra, deps in PROJECT["optional-dependencies"].items()}
ALL_BUT_TESTS = CORE.union(*(deps for extra, deps in EXTRAS.items() if extra != "test"))
ALLOWED = {
    "cait": CORE | EXTRAS["figures"] | EXTRAS["atlas"] | EXTRAS["compare"],
    "app": ALL_BUT_TESTS,
    "analysis": ALL_BUT_TESTS,
    "benchmarks": ALL_BUT_TESTS | EXTRAS["test"],  # app_latency.py drives the page with the tests' playwright
    "scripts": ALL_BUT_TESTS,
    "tests": ALL_BUT_TESTS | EXTRAS["test"],
}


def imported_modules(path: Path) -> set[str]:
    """Top-level names of the absolute imports anywhere in a file: module level, in functions, under `if`/`try`
    (relative imports are the package's own)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def undeclared(folder: str, dists: dict[str, list[str]]) -> list[str]:
    """'file: module (distribution)' for each import under `folder` that no allowed distribution provides
    (`dists`: importlib.metadata.packages_distributions(), top-level module -> distributions)."""
    problems = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        own_venv = OWN_VENV.get(path.relative_to(ROOT).as_posix(), set())
        for module in sorted(imported_modules(path) - OURS - own_venv - set(sys.stdlib_module_names)):
            provided_by = {canonicalize_name(d) for d in dists.get(module, [])}
            if not provided_by & ALLOWED[folder]:
                where = ", ".join(sorted(provided_by)) or "not installed"
                problems.append(f"{path.relative_to(ROOT)}: {module} ({where})")
    return problems


def test_every_third_party_import_is_declared():
    dists = packages_distributions()  # read once: it lists every installed distribution's files
    problems = [line for folder in ALLOWED for line in undeclared(folder, dists)]
    assert not problems, "imports no dependency in pyproject.toml declares:\n" + "\n".join(problems)


def test_the_walk_finds_imports_at_every_level(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import os.path, numpy as np\nfrom torch.nn import functional\nfrom . import sibling\n"
        "def f():\n    try:\n        import scipy.stats\n    except ImportError:\n        from yaml import safe_load\n"
    )
    assert imported_modules(source) == {"os", "numpy", "torch", "scipy", "yaml"}
