"""Commands fail early and in one line: `cait.evaluate --json` to a path that cannot be written refuses before any
work and writes atomically; a checkpoint that does not fit reaches evaluate's and the atlas's one-line error with
the library's diagnosis (the closest variant, the missing keys, the shape mismatches)."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch
from conftest import one_error_line

import cait
from cait.atlas.__main__ import main as atlas_main
from cait.evaluate import __main__ as evaluate_command


@pytest.fixture(scope="module")
def pico(pico_scenes, tmp_path_factory):
    checkpoint, scenes = pico_scenes
    root = tmp_path_factory.mktemp("command_outputs")
    args = ["--checkpoint", str(checkpoint), "--data", str(scenes), "--limit", "4", "--methods", "ca1_mean"]
    return dict(root=root, scenes=scenes, checkpoint=checkpoint, args=[*args, "--workers", "0"])


def one_line(err: str) -> str:
    return one_error_line(err, progress="evaluate:")


def test_evaluate_refuses_an_unwritable_json_before_any_work(pico, capsys, unwritable):
    places = unwritable(evaluate_command, "_model_and_data")
    for target in (places["proc"], places["below a file"], places["folder"]):
        capsys.readouterr()
        assert evaluate_command.main([*pico["args"], "--json", str(target)]) == 2
        assert "cannot write" in one_line(capsys.readouterr().err)


def test_evaluate_writes_its_json_atomically(pico, capsys, monkeypatch):
    """A failure after the bytes are written and before they are safe (a full disk at fsync) leaves the previous
    file whole, no temporary file, and one line with exit 2."""
    path = pico["root"] / "results.json"
    path.write_text('{"previous": true}')

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full_disk)
    capsys.readouterr()
    assert evaluate_command.main([*pico["args"], "--json", str(path)]) == 2
    assert "No space left on device" in one_line(capsys.readouterr().err)
    assert json.loads(path.read_text()) == {"previous": True}
    assert sorted(p.name for p in pico["root"].iterdir() if "results" in p.name) == ["results.json"]
    monkeypatch.undo()
    assert evaluate_command.main([*pico["args"], "--json", str(path)]) == 0
    assert json.loads(path.read_text())["images"] == 4


def test_the_checkpoint_diagnosis_reaches_every_commands_one_line_error(pico, capsys):
    """A plain state dict of cait_pico_32 asked to be a cait_nano_64: evaluate and the atlas both say, in one
    line, what the file looks like and what does not fit."""
    wrong = pico["root"] / "pico.pth"
    torch.save(cait.load_model("cait_pico_32", weights=False).model.state_dict(), wrong)
    data = ["--data", str(pico["scenes"]), "--limit", "4", "--workers", "0"]
    commands = {
        "evaluate": lambda: evaluate_command.main(["--checkpoint", str(wrong), "--model", "cait_nano_64", *data]),
        "atlas": lambda: atlas_main(
            ["--checkpoint", str(wrong), "--model", "cait_nano_64", *data, "--out", str(pico["root"] / "atlas")]
        ),
    }
    for name, command in commands.items():
        capsys.readouterr()
        assert command() == 2, name
        line = one_line(capsys.readouterr().err)
        assert "does not fit this model" in line and "It looks like 'cait_pico_32'" in line, line
        assert "shape mismatches (" in line and "pos_embed: checkpoint (1, 16, 32) vs model (1, 64, 128)" in line


def test_the_explanation_methods_see_a_bounded_chunk_whatever_the_batch(pico, monkeypatch):
    """Evaluate's memory: its gradient and rollout methods never see more than METHOD_CHUNK images at once (a batch
    of 128 at once peaked near 8 GB), and the chunks change no number: a batch of 48 scores as batches of 16."""
    from cait import explain
    from cait.data import read_images
    from cait.evaluate.core import METHOD_CHUNK, evaluate

    model = cait.load_model(checkpoint=pico["checkpoint"]).model.eval()
    data = read_images(str(pico["scenes"]), model.cfg, boxes=pico["scenes"] / "boxes.json", limit=48, sample="first")
    seen, real = [], explain.saliency_maps

    def recording(model, x, *args, **kwargs):
        seen.append(len(x))
        yield from real(model, x, *args, **kwargs)

    monkeypatch.setattr(explain, "saliency_maps", recording)
    methods = ("ca1_mean", "rollout_raw", "saliency")
    chunked = evaluate(model, data, batch_size=48, workers=0, methods=methods, attribution_subset=40)
    broken = data.paths.index("Bag/broken.png")  # not scored
    assert max(seen) == METHOD_CHUNK == 16 and sum(seen) == 47 + 40 - (broken < 40)
    monkeypatch.undo()
    plain = evaluate(model, data, batch_size=METHOD_CHUNK, workers=0, methods=methods, attribution_subset=40)
    rows = {r["method"]: r for r in plain["localization"]}
    assert len(rows) == len(chunked["localization"])
    for row in chunked["localization"]:
        assert row["images"] == rows[row["method"]]["images"]
        for key in ("pointing_game", "mass_in_box"):
            assert row[key] == pytest.approx(rows[row["method"]][key], abs=1e-6), (row["method"], key)
    said = " ".join(evaluate_command.build_parser().format_help().split())
    assert f"take at most {METHOD_CHUNK} of them at a time" in said and "under 3 GB" in said
