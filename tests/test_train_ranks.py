"""What rank 0 alone does under torchrun (`cait.distributed.rank_zero_does`): its failure is every rank's at once,
so no rank is left at the next collective waiting for a rank 0 that has stopped, and a user's mistake is one line
from rank 0, never a traceback from another rank. Real processes on CPU (gloo)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from test_train import TINY, main

REPO = Path(__file__).resolve().parents[1]
# Each of two ranks asks rank 0 for a value, then for work that fails with an input error and with a bug, then
# meets the other at a collective: what each rank saw, one line per step.
RANKS_SCRIPT = """
import sys
from cait.distributed import RankFailed, gather_all, process_group, rank_zero_does
from cait.outputs import OutputError

def refuse():
    raise OutputError("cannot write to out: Not a directory")

def crash():
    return 1 / 0

with process_group("cpu") as (rank, world, device):
    print(rank, "value", rank_zero_does(lambda: "made on rank 0"), flush=True)
    for work in (refuse, crash):
        try:
            rank_zero_does(work)
        except Exception as e:
            print(rank, type(e).__name__, e, flush=True)
    print(rank, "together", gather_all(rank), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rank_zeros_failure_reaches_every_rank_at_once():
    """Two processes as torchrun starts them: rank 0's value stays on rank 0; its input error is raised on
    both ranks as it is; its bug stays a bug on rank 0 and is RankFailed on rank 1; both then still meet."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANKS_SCRIPT],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err for _, err in outs]
    assert outs[0][0].splitlines() == [
        "0 value made on rank 0",
        "0 OutputError cannot write to out: Not a directory",
        "0 ZeroDivisionError division by zero",
        "0 together [0, 1]",
    ]
    assert outs[1][0].splitlines() == [
        "1 value None",
        "1 OutputError cannot write to out: Not a directory",
        "1 RankFailed rank 0 failed (ZeroDivisionError: division by zero); its traceback says where",
        "1 together [0, 1]",
    ]


def test_an_output_that_cannot_be_written_is_one_line_before_any_step(tmp_path, capsys):
    below_a_file = tmp_path / "a_file" / "run"
    below_a_file.parent.write_text("")
    assert main([*TINY, "--subset", "64", "--epochs", "1", "--output", str(below_a_file)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"python -m cait.train: error: cannot write to {below_a_file}: Not a directory"
    )


def test_torchrun_a_bad_output_ends_every_rank_with_rank_0s_line(tmp_path):
    """--output below a file, which rank 0 alone writes: rank 1 stops with it at once (no traceback of a
    collective whose peer is gone), and rank 0 says the one line."""
    out = tmp_path / "a_file" / "run"
    out.parent.write_text("")
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "cait.train", *TINY, "--subset", "256"]
    proc = subprocess.run(
        [*command, "--epochs", "1", "--precision", "fp32", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode != 0
    err = proc.stderr
    assert err.count(f"python -m cait.train: error: cannot write to {out}: Not a directory") == 1, err[-3000:]
    # the only traceback is torchrun's own report of the failed ranks: none from a rank
    assert err.count("Traceback (most recent call last)") == 1 and "[rank" not in err, err[-3000:]
    assert "exitcode  : 2" in err, err[-3000:]  # a rank that saw the error (torchrun may stop the other first)
