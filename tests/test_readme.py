"""Every snippet and command in the README runs as written (issue 46): each Python block is executed, each
command line is parsed by its own command (`--help` appended, so the flags before it are checked and nothing
runs). The snippet of docs/explanations.md runs too, and every `cait.explain` name the README and the docs write
resolves, the top level staying what they teach (issue 57: 30 names at most)."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP_LEVEL_MOST = 30  # what a user calls and the types it returns; the rest lives in the submodules


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def command_lines(text: str) -> list[str]:
    """The README's indented command lines run with the project's interpreter (not setup.sh, not pytest)."""
    lines = [m.strip() for m in re.findall(r"^    (\.venv/bin/python .*)$", text, flags=re.M)]
    return [re.sub(r"\s+#.*$", "", line) for line in lines if " -m pytest" not in line]


def test_the_readme_is_short_and_has_what_it_promises():
    assert 100 <= len(README.splitlines()) <= 120
    assert len(python_blocks(README)) == 1 and "cait.load_model(" in python_blocks(README)[0]
    assert "create_model" not in README
    assert len(command_lines(README)) >= 8


@pytest.mark.parametrize("block", python_blocks(README) + python_blocks((REPO / "docs/explanations.md").read_text()))
def test_every_python_snippet_runs(block, monkeypatch):
    monkeypatch.chdir(REPO)
    exec(compile(block, "README snippet", "exec"), {"__name__": "readme"})


@pytest.mark.parametrize("line", command_lines(README))
def test_every_command_line_parses(line):
    argv = [sys.executable, *line.split()[1:], "--help"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def explain_references(text: str) -> list[str]:
    """The dotted `cait.explain` names `text` writes: `cait.explain.X.Y`, `explain.X` (after `from cait import
    explain`) and each name of `from cait.explain[.sub] import A, B`."""
    found = [f"{m[1]}.{name.strip()}" for m in re.finditer(r"from (cait\.explain[\w.]*) import ([\w, ]+)", text)
             for name in m[2].split(",")]  # fmt: skip
    found += ["cait." + m[1] for m in re.finditer(r"(?<![\w.])(?:cait\.)?(explain(?:\.\w+)+)", text)]
    return found


def resolves(dotted: str) -> bool:
    """Whether `dotted` names something: its longest importable module prefix, then attributes (as Python's
    `from a.b import c` reads `a.b` as a module)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_the_reference_reader_finds_each_form_and_a_missing_name():
    text = "from cait.explain.maps import overlay, upsample\n`cait.explain.agreement.MapAgreement` explain.METHODS"
    assert explain_references(text) == [
        "cait.explain.maps.overlay",
        "cait.explain.maps.upsample",
        "cait.explain.maps",
        "cait.explain.agreement.MapAgreement",
        "cait.explain.METHODS",
    ]
    assert resolves("cait.explain.token_patching.region_bounds") and not resolves("cait.explain.no_such_name")


def test_every_explain_name_the_docs_write_resolves():
    written = {(doc.relative_to(REPO).as_posix(), ref) for doc in DOCS for ref in explain_references(doc.read_text())}
    assert len(written) >= 10, written
    assert not [f"{doc}: {ref}" for doc, ref in sorted(written) if not resolves(ref)]


def test_the_top_level_of_cait_explain_stays_small():
    """At most TOP_LEVEL_MOST public names besides the submodules, each in __all__: none bound by the way (an
    import's name, `from __future__ import annotations`'s), none served lazily by a module __getattr__."""
    from cait import explain

    names = [n for n in dir(explain) if not n.startswith("_")]
    public = {n for n in names if not isinstance(getattr(explain, n), types.ModuleType)}
    assert public == set(explain.__all__) and not hasattr(explain, "__getattr__")
    assert len(public) <= TOP_LEVEL_MOST, sorted(public)
