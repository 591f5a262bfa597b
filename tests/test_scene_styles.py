"""The scenes' styles: the default renders as before, bit for bit; "varied" draws its look per scene and keeps the
boxes exact; the pixel-noise override; each style its own cache file."""

import hashlib
import json

import numpy as np
import pytest

from cait.data import DataError, FashionMNISTScenes, build_dataset
from cait.data.scene_cache import _prefix, cache_path

# sha256 (first 16 hex digits) of whole-split scenes rendered by generator version 1, before styles existed
VERSION_1 = {
    ("val", 0, 0): "df4c18bbe395a23d",
    ("val", 0, 1): "9606af0bda759059",
    ("val", 0, 77): "765a803e8c37a5d7",
    ("val", 0, 9999): "3884e47537b58fa1",
    ("train", 3, 0): "c512be3457d68b87",
    ("train", 3, 59999): "24565a564892eda4",
}


def _digest(image: np.ndarray) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()[:16]


def test_the_default_style_renders_version_1s_pixels():
    for (split, seed, i), digest in VERSION_1.items():
        scenes = FashionMNISTScenes(split, seed=seed)
        assert _digest(scenes.render(i)) == digest, (split, seed, i)
        # the noise override at the default's own std changes nothing either
        assert _digest(FashionMNISTScenes(split, seed=seed, pixel_noise=0.04).render(i)) == digest


def test_the_varied_style_draws_its_look_per_scene_and_keeps_the_garment_in_its_box():
    default = FashionMNISTScenes("val", subset=40)
    varied = FashionMNISTScenes("val", subset=40, style="varied")
    np.testing.assert_array_equal(varied.boxes, default.boxes)  # the same layout and garments
    looks = set()
    for i in range(40):
        scene, bare = varied.render(i).astype(int), varied.render(i, garment=False).astype(int)
        assert np.array_equal(scene, varied.render(i).astype(int))  # a pure function of the index
        x0, y0, x1, y1 = varied.boxes[i]
        inside = np.zeros(scene.shape[:2], bool)
        inside[int(np.floor(y0)) : int(np.ceil(y1)), int(np.floor(x0)) : int(np.ceil(x1))] = True
        drawn = (scene != bare).any(axis=-1)
        assert not drawn[~inside].any(), i  # nothing of the garment outside its box
        assert drawn[inside].mean() > 0.2, i  # and the garment is there
        looks.add(tuple(np.round(list(varied._style_draws(i).values()), 3)))
        assert not np.array_equal(scene, default.render(i))
    assert len(looks) == 40  # every scene its own draws
    noisy = FashionMNISTScenes("val", subset=40, pixel_noise=0.08)
    diff = noisy.render(3).astype(float) - default.render(3).astype(float)
    assert 4 < diff.std() < 12  # 0.08 vs 0.04 on the 0-255 scale: the added noise has std about 0.04 * 255


def test_styles_are_cached_apart_and_bad_styles_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("CAIT_LENS_CACHE", str(tmp_path))
    kinds = [
        FashionMNISTScenes("val", subset=30),
        FashionMNISTScenes("val", subset=30, style="varied"),
        FashionMNISTScenes("val", subset=30, pixel_noise=0.08),
    ]
    paths = [cache_path(s) for s in kinds]
    assert len(set(paths)) == 3
    for s, path in zip(kinds, paths):  # a style's stale-file glob (prefix-*) never matches another style's file
        assert [p.name.startswith(_prefix(s) + "-") for p in paths].count(True) == 1, path
    for s in kinds:
        s.pixels  # each built in the same directory: none removes another
    assert all(p.is_file() for p in paths)
    np.testing.assert_array_equal(kinds[1].pixels[5], kinds[1].render(5))
    with pytest.raises(DataError, match="scene style"):
        FashionMNISTScenes("val", subset=2, style="fancy")
    with pytest.raises(DataError, match="fashion-mnist-scenes only"):
        build_dataset("fashion-mnist", "val", subset=2, style="varied")


def test_evaluate_runs_on_varied_scenes_and_with_more_noise(tmp_path, capsys):
    """The command's main in this process (tests/test_evaluate.py runs the `python -m` entry): a fresh interpreter
    for each run would only add its imports."""
    import cait
    from cait.evaluate.__main__ import main

    model = cait.load_model("cait_pico_32", weights=False, img_size=64).model
    ckpt = tmp_path / "m.safetensors"
    cait.save_weights(model, ckpt)
    out = tmp_path / "r.json"
    command = ["--checkpoint", str(ckpt), "--subset", "8", "--workers", "0"]
    command += ["--methods", "ca1_mean", "--scene-style", "varied", "--pixel-noise", "0.08", "--json", str(out)]
    assert main(command) == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["scene_style"] == "varied" and result["pixel_noise"] == 0.08 and result["images"] == 8
    assert main([*command[:-2], "--data", "fashion-mnist"]) == 2
    assert "fashion-mnist-scenes only" in capsys.readouterr().err


def test_the_light_style_draws_a_dark_garment_on_a_light_background_inside_its_box():
    default = FashionMNISTScenes("val", subset=30)
    light = FashionMNISTScenes("val", subset=30, style="light")
    np.testing.assert_array_equal(light.boxes, default.boxes)
    for i in range(30):
        scene, bare = light.render(i).astype(float), light.render(i, garment=False).astype(float)
        x0, y0, x1, y1 = light.boxes[i]
        inside = np.zeros(scene.shape[:2], bool)
        inside[int(np.floor(y0)) : int(np.ceil(y1)), int(np.floor(x0)) : int(np.ceil(x1))] = True
        drawn = (scene != bare).any(axis=-1)
        assert not drawn[~inside].any(), i
        # the garment's body (where it covers the scene most) is darker than the background it covers
        body = (np.abs(scene - bare).sum(-1) > 60) & inside
        assert scene[body].mean() < bare[body].mean() - 20, i
        assert bare[~inside].mean() > default.render(i, garment=False)[~inside].astype(float).mean(), i


def test_the_mixed_style_draws_each_scene_light_or_varied():
    mixed = FashionMNISTScenes("val", subset=24, style="mixed")
    looks = {
        "light": FashionMNISTScenes("val", subset=24, style="light"),
        "varied": FashionMNISTScenes("val", subset=24, style="varied"),
    }
    seen = []
    for i in range(24):
        scene = mixed.render(i)
        matches = [name for name, scenes in looks.items() if np.array_equal(scene, scenes.render(i))]
        assert len(matches) == 1, i
        seen.append(matches[0])
    assert 6 < seen.count("light") < 18  # about half of each


def test_the_blend_style_is_mixed_with_half_its_varied_scenes_drawn_default():
    blend = FashionMNISTScenes("val", subset=40, style="blend")
    mixed = FashionMNISTScenes("val", subset=40, style="mixed")
    default = FashionMNISTScenes("val", subset=40)
    seen = []
    for i in range(40):
        scene, mixed_scene = blend.render(i), mixed.render(i)
        if mixed._look(i) == "light" or np.array_equal(scene, mixed_scene):
            np.testing.assert_array_equal(scene, mixed_scene)  # the same coin: mixed's light scenes stay light
            seen.append(mixed._look(i))
        else:
            np.testing.assert_array_equal(scene, default.render(i))  # the default style's pixels, bit for bit
            seen.append("default")
    assert 10 < seen.count("light") < 30 and 3 < seen.count("default") < 17 and 3 < seen.count("varied") < 17
    assert cache_path(blend) != cache_path(mixed)
