"""The whole tree passes ruff's lint and is ruff-formatted (rules and line length in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_finds_nothing(command):
    assert RUFF, "ruff is not installed: pip install -r requirements.txt"
    done = subprocess.run([RUFF, *command, "."], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_model_training_and_evaluation_need_no_drawing_library():
    """`pip install cait-lens` (no extras) gives the model, training and evaluation: none imports matplotlib,
    plotly or gradio, which only the `figures` and `app` extras install."""
    code = (
        "import sys, cait, cait.model, cait.factory, cait.train.loop, cait.evaluate, cait.explain\n"
        "print(sorted(m for m in ('matplotlib', 'plotly', 'gradio') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
