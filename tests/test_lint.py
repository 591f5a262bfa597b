"""Static check of every source file: no unused imports, undefined names or shadowed definitions."""
import io
from pathlib import Path

from pyflakes.api import checkRecursive
from pyflakes.reporter import Reporter

REPO = Path(__file__).resolve().parents[1]


def test_pyflakes_finds_nothing():
    report = io.StringIO()
    found = checkRecursive([str(REPO / d) for d in ("cait", "app", "analysis", "benchmarks", "scripts", "tests")],
                           Reporter(report, report))
    assert found == 0, report.getvalue()
