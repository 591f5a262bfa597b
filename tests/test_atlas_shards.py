"""The atlas's files on disk never trusted blindly: a damaged, emptied or swapped shard is redone, a skipped image
is retried, a failure midway through a write leaves no half file, an output that cannot be written is one line
before any work, a second run into a locked --out is refused, and torchrun's merge waits for a slow rank. Each
against an uninterrupted one-process run of the same small atlas (12 images, 3 shards)."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import conftest
import numpy as np
import pytest
from filelock import FileLock

from cait.atlas import run as atlas_run
from cait.atlas.__main__ import main
from cait.atlas.outdir import LOCK_FILE
from cait.atlas.shards import ARGS_FILE, FORMAT
from cait.distributed import balanced_runs

REPO = Path(__file__).resolve().parent.parent
FILES = ("images.csv", "heads.csv", "summary.json", "atlas.html")


@pytest.fixture(scope="module")
def small(tmp_path_factory, pico_scenes):
    """12 exported scenes of two classes in a folder of their own, the atlas arguments, and a reference run."""
    root = tmp_path_factory.mktemp("atlas_shards")
    checkpoint, scenes = pico_scenes
    for folder in ("Bag", "Coat"):
        (root / "data" / folder).mkdir(parents=True)
        for png in sorted((scenes / folder).glob("*.png"))[:6]:
            shutil.copy(png, root / "data" / folder / png.name)
    args = ["--checkpoint", str(checkpoint), "--data", str(root / "data"), "--shard-size", "4", "--batch-size", "4"]
    args += ["--exemplars", "1", "--workers", "0"]
    assert main([*args, "--out", str(root / "reference")]) == 0
    return dict(root=root, args=args, reference=root / "reference")


def shard_names(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "shards").iterdir())


def assert_as_reference(out: Path, reference: Path) -> None:
    for name in FILES:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def one_error_line(err: str) -> str:
    """The one error line, besides the progress bar and the line saying a rerun continues."""
    said = [line for line in err.splitlines() if not line.startswith(("continuing: ", "all 12 images were done"))]
    return conftest.one_error_line("\n".join(said), progress="atlas:")


def test_damaged_emptied_and_swapped_shards_are_redone_with_a_line(small, capsys):
    out = small["root"] / "damaged"
    shutil.copytree(small["reference"], out)
    first, second, third = sorted((out / "shards").glob("*.npz"))
    first.write_bytes(first.read_bytes()[:300])  # truncated
    second.write_bytes(b"")  # emptied
    shutil.copy(small["reference"] / "shards" / first.name, third)  # another shard's valid file in its place
    capsys.readouterr()
    assert main([*small["args"], "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{first.name} is damaged (" in err and f"{second.name} is damaged (" in err, err
    assert f"{third.name} holds images 0-4, not the ones its name says: redoing it" in err, err
    assert shard_names(out) == shard_names(small["reference"])
    assert_as_reference(out, small["reference"])


def test_a_shard_whose_numbers_changed_but_whose_file_and_record_hold_is_redone_by_its_checksum(small, capsys):
    """A well-formed shard of the right name, range, images and arguments, one of its numbers changed (a bit
    flipped on disk, a bug in a writer): only its checksum tells, and the shard is redone."""
    out = small["root"] / "flipped"
    shutil.copytree(small["reference"], out)
    shard = sorted((out / "shards").glob("*.npz"))[1]
    with np.load(shard, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    changed = next(k for k, a in arrays.items() if a.dtype.kind == "f" and a.size and np.isfinite(a).any())
    arrays[changed] = arrays[changed].copy()
    arrays[changed].flat[int(np.flatnonzero(np.isfinite(arrays[changed]))[0])] += 1.0
    with open(shard, "wb") as f:
        np.savez(f, **arrays)  # the same record (its meta array, with the old checksum)
    capsys.readouterr()
    assert main([*small["args"], "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{shard.name} is damaged (its checksum does not match): redoing it" in err, err
    assert err.count("redoing it") == 1
    assert_as_reference(out, small["reference"])


def test_a_shard_of_other_images_is_redone(small, capsys):
    """The same name and range, but the folder changed under --out since: the shard's paths' hash tells."""
    data = small["root"] / "data_changing"
    shutil.copytree(small["root"] / "data", data)
    args = [str(data) if a == str(small["root"] / "data") else a for a in small["args"]]
    out = small["root"] / "foreign"
    assert main([*args, "--out", str(out)]) == 0
    coat = sorted((data / "Coat").glob("*.png"))[-1]
    coat.rename(coat.with_name("z" + coat.name))  # the last shard's images are other files now
    capsys.readouterr()
    assert main([*args, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    redone = shard_names(small["reference"])[-1]
    assert f"{redone} was made for other images: redoing it" in err and err.count("redoing it") == 1, err
    assert f"Coat/z{coat.name}" in (out / "images.csv").read_text()


def test_a_skipped_image_is_retried_when_it_is_readable_again(small, capsys):
    data = small["root"] / "data_flaky"
    shutil.copytree(small["root"] / "data", data)
    flaky = sorted((data / "Coat").glob("*.png"))[0]
    good = flaky.read_bytes()
    flaky.write_bytes(good[:40])  # unreadable mid-run (a copy still in progress, a network share)
    args = [str(data) if a == str(small["root"] / "data") else a for a in small["args"]]
    out = small["root"] / "flaky"
    assert main([*args, "--out", str(out)]) == 0
    assert (out / "summary.json").read_text().count(f"Coat/{flaky.name}") == 1  # in the skipped list
    flaky.write_bytes(good)
    capsys.readouterr()
    assert main([*args, "--out", str(out)]) == 0
    assert "skipped 1 unreadable image(s): retrying them" in capsys.readouterr().err
    for name in FILES[:3]:  # the same images as the reference now (only the data's folder name differs)
        assert (out / name).read_text().replace(str(data.name), "data") == (small["reference"] / name).read_text()


def test_a_file_that_stays_unreadable_does_not_redo_its_shard(small, capsys):
    """Issue 59: a file that stayed unreadable made every rerun of a finished atlas recompute its whole shard.
    A rerun tries the skipped file alone; failing again for the same reason, the shard is kept, and a line says
    so; failing for another reason (here: gone), the shard is redone."""
    data = small["root"] / "data_broken"
    shutil.copytree(small["root"] / "data", data)
    broken = sorted((data / "Coat").glob("*.png"))[0]
    broken.write_bytes(b"not an image")
    args = [str(data) if a == str(small["root"] / "data") else a for a in small["args"]]
    out = small["root"] / "broken"
    assert main([*args, "--out", str(out)]) == 0
    shard = next(p for p in (out / "shards").glob("*.npz") if _skips(p))
    made = shard.stat().st_mtime_ns, shard.stat().st_ino
    capsys.readouterr()
    assert main([*args, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert (
        f"{shard.name}: its 1 unreadable image(s) failed again for the same reason (not an image PIL can read)" in err
    )
    assert (shard.stat().st_mtime_ns, shard.stat().st_ino) == made  # not recomputed
    assert json.loads((out / "summary.json").read_text())["skipped"] == [f"Coat/{broken.name}"]
    broken.write_bytes(_truncated_png())
    assert main([*args, "--out", str(out)]) == 0
    assert f"{shard.name} skipped 1 unreadable image(s): retrying them" in capsys.readouterr().err
    assert (shard.stat().st_mtime_ns, shard.stat().st_ino) != made


def _truncated_png() -> bytes:
    """A PNG whose header reads and whose pixels are cut off: another reason than "not an image"."""
    from PIL import Image

    whole = io.BytesIO()
    Image.new("RGB", (32, 32), "red").save(whole, format="PNG")
    return whole.getvalue()[:60]


def _skips(shard: Path) -> int:
    with np.load(shard) as f:
        return len(f["skipped"])


def _files(out: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != LOCK_FILE}


def test_an_atlas_of_another_format_is_refused_in_one_line_and_left_as_it_was(small, capsys):
    """A rerun into an atlas made by another version of cait.atlas, whose shards may hold other numbers under the
    same names: one line saying what is wrong and what to do, and none of its files touched (no mix)."""
    made = small["root"] / "one_shard"
    assert main([*small["args"], "--out", str(made), "--stop-after", "1"]) == 0  # one shard of three
    recorded = json.loads((made / ARGS_FILE).read_text())
    assert recorded["format"] == FORMAT
    cases = {  # what atlas_args.json holds: every atlas before formats were recorded, and one of a later format
        "unrecorded": ({k: v for k, v in recorded.items() if k != "format"}, f"(no format in {ARGS_FILE})"),
        "newer": ({**recorded, "format": FORMAT + 1}, f"of format {FORMAT + 1}, made by a newer version"),
    }
    for name, (old_args, said) in cases.items():
        out = small["root"] / f"format_{name}"
        shutil.copytree(made, out)
        (out / ARGS_FILE).write_text(json.dumps(old_args))
        before = _files(out)
        capsys.readouterr()
        assert main([*small["args"], "--out", str(out)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert said in line and line.endswith("use another --out, or delete it to make it again"), line
        assert _files(out) == before
    merged_only = small["root"] / "format_merged_only"  # an atlas from before shards: its merged files alone
    merged_only.mkdir()
    for name in FILES:
        shutil.copy(small["reference"] / name, merged_only / name)
    before = _files(merged_only)
    assert main([*small["args"], "--out", str(merged_only)]) == 2
    assert f"older version of cait.atlas (no {ARGS_FILE})" in one_error_line(capsys.readouterr().err)
    assert _files(merged_only) == before


def _half_then_fail(real, calls: list, fail_at: int):
    """A writer that, on its `fail_at`-th call, writes half of what `real` would and raises a full disk."""

    def write(f, *args, **kwargs):
        calls.append(1)
        if len(calls) != fail_at:
            return real(f, *args, **kwargs)
        buffer = io.BytesIO()
        real(buffer, *args, **kwargs)
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f.name)

    return write


def test_a_failure_midway_through_a_write_leaves_no_half_file(small, capsys, monkeypatch):
    out = small["root"] / "full_disk"
    calls: list = []
    monkeypatch.setattr(np, "savez", _half_then_fail(np.savez, calls, fail_at=2))
    capsys.readouterr()
    assert main([*small["args"], "--out", str(out)]) == 2
    assert "No space left on device" in one_error_line(capsys.readouterr().err)
    assert shard_names(out) == shard_names(small["reference"])[:1]  # the half-written second shard is not there
    monkeypatch.undo()

    def page_half_then_fail(path, *args, **kwargs):  # atlas.html written half, then the disk is full
        real_write_page(path, *args, **kwargs)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    real_write_page = atlas_run.write_page
    monkeypatch.setattr(atlas_run, "write_page", page_half_then_fail)
    assert main([*small["args"], "--out", str(out)]) == 2
    one_error_line(capsys.readouterr().err)
    assert shard_names(out) == shard_names(small["reference"])  # the second shard redone, the third done
    assert not any((out / name).exists() for name in FILES)  # no merged file, rather than half of one
    monkeypatch.undo()
    assert main([*small["args"], "--out", str(out)]) == 0
    assert_as_reference(out, small["reference"])
    # a merge that fails over a finished atlas leaves its files as they were
    monkeypatch.setattr(atlas_run, "write_page", page_half_then_fail)
    assert main([*small["args"], "--out", str(out)]) == 2
    assert_as_reference(out, small["reference"])
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".merg")) == []


def test_an_output_that_cannot_be_written_is_one_line_before_any_work(small, capsys, unwritable):
    places = unwritable(atlas_run, "run_shards")
    for out in (places["file"], places["below a file"], places["proc"]):
        capsys.readouterr()
        assert main([*small["args"], "--out", str(out)]) == 2
        assert f"cannot write to {out}" in one_error_line(capsys.readouterr().err)


def test_a_second_run_into_a_locked_out_is_refused(small, capsys):
    out = small["root"] / "locked"
    out.mkdir()
    with FileLock(out / LOCK_FILE):  # a first run at work
        capsys.readouterr()
        assert main([*small["args"], "--out", str(out)]) == 2
        assert f"another atlas run is writing to {out}" in one_error_line(capsys.readouterr().err)
    assert not (out / "shards").exists() or shard_names(out) == []
    assert main([*small["args"], "--out", str(out)]) == 0  # once it is done, the same command runs


def test_balanced_runs_whatever_the_shard_size():
    """Shares of whole batches (the batches of one process) differing by at most one, cut at the shard size."""
    assert balanced_runs(list(range(400)), 2, 256, batch=8) == [[range(0, 200)], [range(200, 400)]]
    assert balanced_runs(list(range(400)), 2, 256, batch=64) == [[range(0, 192)], [range(192, 400)]]
    assert balanced_runs(list(range(10)), 3, 2) == [
        [range(0, 2), range(2, 3)],
        [range(3, 5), range(5, 6)],
        [range(6, 8), range(8, 10)],
    ]
    assert balanced_runs(list(range(151)), 2, 32, batch=16) == [
        [range(0, 32), range(32, 64), range(64, 80)],
        [range(80, 112), range(112, 144), range(144, 151)],
    ]
    # what is left around finished shards: runs never cross a gap, batches stay whole
    assert balanced_runs([0, 1, 5, 6, 7, 9], 2, 4) == [[range(0, 2), range(5, 6)], [range(6, 8), range(9, 10)]]
    assert balanced_runs([4, 5, 6, 7, 12, 13], 2, 8, batch=4) == [[range(4, 8)], [range(12, 14)]]
    assert balanced_runs([], 2, 4) == [[], []]


def test_torchrun_merge_waits_for_a_slow_rank(small):
    """Rank 1 writes each shard 3 s late: rank 0 must wait for it before merging, and the files equal one
    process's byte for byte (summary.json and atlas.html too: nothing depends on the thread count)."""
    out = small["root"] / "slow_rank"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLOW_RANK_SECONDS": "3"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += [str(REPO / "tests" / "slow_rank.py"), *small["args"], "--out", str(out)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "12 images to do over 2 processes (rank 0: 4 images in 1 shard(s), rank 1: 8 images in 2 shard(s))" in (
        proc.stderr
    )
    assert_as_reference(out, small["reference"])


def test_messages_name_the_file_the_folder_and_the_resume(small, capsys, monkeypatch):
    """Issue 59: a full disk while merging named no file; "the shards written are kept" was said of an --out
    that was gone; a folder in place of a shard was announced "redoing it" and then failed; a resuming rerun said
    nothing. Each now says what is so, in one line."""
    out = small["root"] / "messages"
    shutil.copytree(small["reference"], out)
    (out / "summary.json").unlink()

    def full(path, *args, **kwargs):  # what a write() on a full disk raises: no file name
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atlas_run.report, "write_csv", full)
    capsys.readouterr()
    assert main([*small["args"], "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "all 12 images were done before: merging" in err
    line = one_error_line(err)
    assert line.startswith(f"python -m cait.atlas: error: cannot write {out}") and "No space left on device" in line
    assert line.endswith("the shards written are kept"), line

    def gone(args):  # --out deleted while the run wrote it, then the disk fails
        shutil.rmtree(args.out)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args.out / "shards" / "x.npz"))

    monkeypatch.setattr(atlas_run, "run", gone)
    assert main([*small["args"], "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "No space left on device" in line and "kept" not in line, line
    monkeypatch.undo()

    shutil.copytree(small["reference"], out)
    first = sorted((out / "shards").glob("*.npz"))[0]
    first.unlink()
    first.mkdir()
    assert main([*small["args"], "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.endswith(f"{first} is a folder, not a shard file: move or delete it"), line
    first.rmdir()
    assert main([*small["args"], "--out", str(out)]) == 0
    assert "continuing: 8 of 12 images were done before, 4 to do" in capsys.readouterr().err


def test_data_warnings_are_one_line_and_said_by_rank_zero_only():
    """Issue 59: a DataWarning printed its source line on every run, and once per torchrun rank."""
    import warnings

    from cait.data import DataWarning

    with atlas_run.one_line_warnings(rank=0):
        assert warnings.formatwarning(DataWarning("3 boxes left out"), DataWarning, "x.py", 1, "code") == (
            "warning: 3 boxes left out\n"
        )
        assert "code" in warnings.formatwarning(UserWarning("other"), UserWarning, "x.py", 1, "code")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with atlas_run.one_line_warnings(rank=1):
            warnings.warn("3 boxes left out", DataWarning)
    assert said == []


def test_a_skip_reason_names_no_absolute_path(tmp_path):
    from cait.data.image_file import unreadable_reason

    path = str(tmp_path / "a.png")
    reason = unreadable_reason(PermissionError(errno.EACCES, os.strerror(errno.EACCES), path))
    assert reason == "PermissionError: Permission denied" and str(tmp_path) not in reason


def test_the_sums_are_the_same_whatever_the_shard_boundaries():
    """Issue 59: one process and torchrun differed in the 16th digit when their shards split the images at other
    places (float64 sums per shard, then over the shards). The running sums add image by image in image order:
    the same bits whatever the boundaries."""
    from cait.atlas.report import Moments, Ratio

    rng = np.random.default_rng(0)
    values = (rng.standard_normal((200, 3, 4)) * 10.0 ** rng.integers(-6, 6, (200, 3, 4))).astype(np.float32)
    gap = rng.standard_normal(200).astype(np.float32)
    results = []
    for cuts in ([0, 200], [0, 64, 128, 192, 200], [0, 7, 80, 151, 200]):
        mo, ratio = Moments((3, 4)), Ratio((3, 4))
        for start, stop in zip(cuts, cuts[1:]):
            mo.add(values[start:stop])
            ratio.add(values[start:stop], gap[start:stop])
        results.append(np.stack([mo.mean, mo.std, mo.half_width, ratio.ratio, ratio.half_width]))
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()
