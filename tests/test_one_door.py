"""One door to a model (issue 46): `cait.load_model` for every case, `cait.factory.load_from_flags` for every
command line, and no second name."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest
import torch

import cait
from cait.factory import load_from_flags


def test_the_door_is_the_only_name():
    assert "create_model" not in cait.__all__ and not hasattr(cait, "create_model")
    assert "load_model" in cait.__all__


def test_a_random_init_on_request_reads_no_weights_and_says_so():
    """weights=False: the architecture at the seeded random init, also for a variant whose weights ship."""
    shipped = cait.load_model(cait.DEFAULT_MODEL)
    asked = cait.load_model(cait.DEFAULT_MODEL, weights=False)
    again = cait.load_model(cait.DEFAULT_MODEL, weights=False)
    assert shipped.trained and not asked.trained
    assert not torch.equal(asked.model.head.weight, shipped.model.head.weight)
    assert torch.equal(asked.model.head.weight, again.model.head.weight)  # seeded: the same numbers every run
    assert asked.source == "random init (seed 0)" and "a random init as asked" in asked.made_from
    assert cait.load_model("cait_pico_32", weights=False, num_classes=3).model.head.out_features == 3


def test_a_random_init_with_weights_asked_for_is_refused(tmp_path):
    with pytest.raises(cait.ConfigError, match="weights=False builds a random init"):
        cait.load_model("cait_pico_32", tmp_path / "x.safetensors", weights=False)
    with pytest.raises(cait.ConfigError, match="weights=False builds a random init"):
        cait.load_model("cait_pico_32", pretrained=True, weights=False)


def _flags(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"model": None, "checkpoint": None, "pretrained": False, "random_init": False} | given)


def test_load_from_flags_is_the_door_with_the_flags_policy(capsys, tmp_path):
    loaded = load_from_flags(_flags(model="cait_pico_32", random_init=True), num_classes=4)
    assert loaded.model.head.out_features == 4 and not loaded.trained
    assert capsys.readouterr().err.startswith("WARNING: Untrained: no weights for cait_pico_32 here")
    assert load_from_flags(_flags()).name == cait.DEFAULT_MODEL and capsys.readouterr().err == ""
    (tmp_path / "notes.txt").write_text("not weights")
    with pytest.raises(cait.InputError, match="notes.txt is a text file, not a checkpoint"):
        load_from_flags(_flags(checkpoint=str(tmp_path / "notes.txt")))
    with pytest.raises(cait.InputError, match="no weights for 'cait_pico_32' here"):
        load_from_flags(_flags(model="cait_pico_32"))


def test_the_flags_module_stays_torch_free():
    """--help of every command answers without importing torch: load_from_flags imports the loader lazily."""
    code = "import sys, cait.flags; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("command", ["cait.evaluate", "cait.atlas", "cait.compare", "analysis"])
def test_every_command_line_loads_through_the_door(monkeypatch, capsys, tmp_path, command):
    """Each command's model comes from load_from_flags (the one loader), and its InputError is the command's
    one-line message and exit code 2."""
    import cait.factory

    # Import the commands first: a module importing `load_model` by name while the patch stands would keep the fake.
    for module in ("cait.evaluate.__main__", "cait.atlas.__main__", "cait.compare.__main__", "layerscale_stats"):
        importlib.import_module(module)

    def door(*args, **kwargs):
        raise cait.InputError("the door was asked")

    monkeypatch.setattr(cait.factory, "load_model", door)
    if command == "cait.evaluate":
        from cait.evaluate.__main__ import main

        code = main(["--model", "cait_pico_32"])
    elif command == "cait.atlas":
        from cait.atlas.__main__ import main

        code = main(["--model", "cait_pico_32", "--data", "fashion-mnist-scenes", "--out", str(tmp_path / "a")])
    elif command == "cait.compare":
        from cait.compare.__main__ import main

        pair = ["--model-a", "cait_pico_32", "--model-b", "cait_pico_32"]
        code = main([*pair, "--data", "fashion-mnist-scenes", "--out", str(tmp_path / "c")])
    else:
        from layerscale_stats import main

        with pytest.raises(SystemExit) as exit_:
            main(["--out", str(tmp_path / "s")])
        code = exit_.value.code
    assert code == 2
    assert capsys.readouterr().err.strip().endswith("error: the door was asked")


def test_weights_are_known_by_their_content_and_a_file_trained_again_at_its_path_is_another_model(tmp_path):
    """The weights' identity (`SourcedModel.weights_id`, in `made_from`, the line every output carries) is the
    sha256 of the file, hashed by hashlib here: another file at the same path is another model, the same bytes
    again the same one; a second load of one file version reads no byte for its identity."""
    import hashlib

    from conftest import randomise_

    from cait.provenance import file_sha256

    path, twins = tmp_path / "pico.safetensors", []
    for seed in (1, 2, 1):  # trained, trained again, the first weights back
        cait.save_weights(randomise_(cait.load_model("cait_pico_32", weights=False).model, seed=seed), path)
        twins.append(cait.load_model(checkpoint=path))
        want = "sha256 " + hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        assert twins[-1].weights_id == want and twins[-1].made_from.endswith(f"; weights {want}")
    first, retrained, back = twins
    assert retrained.weights_id != first.weights_id and retrained.made_from != first.made_from
    assert back.weights_id == first.weights_id and back.made_from == first.made_from
    hashed = file_sha256.cache_info().misses
    assert cait.load_model(checkpoint=path).weights_id == back.weights_id
    assert file_sha256.cache_info().misses == hashed  # the same file version: not hashed again
    assert cait.load_model("cait_pico_32", weights=False).weights_id == "random init, seed 0"
