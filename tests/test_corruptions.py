"""cait.corruptions (ImageNet-C on batches), cait.robustness (sweep, mCE) and cait.evaluate --corruption."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from skimage.color import hsv2rgb, rgb2hsv
from skimage.filters import gaussian
from torchvision.transforms.v2.functional import normalize

import cait
from cait.corruptions import CORRUPTIONS, SEVERITIES, box_weights, corrupt, disk_kernel, nearest_indices
from cait.data import FashionMNISTScenes
from cait.preprocess import model_view, view_pixels
from cait.robustness import mean_corruption_error, parse_corruptions

RANDOM = {"gaussian_noise", "shot_noise", "impulse_noise"}
# the reference package's outputs (scripts/make_corruption_fixture.py): "{family}_{H}x{W}.png", severities 1-5 stacked
REFERENCE = Path(__file__).parent / "data" / "corruptions"
REFERENCE_CASES = sorted(p.stem.rsplit("_", 1) for p in REFERENCE.glob("*.png") if not p.stem.startswith("clean_"))


@pytest.fixture(scope="module")
def scenes() -> torch.Tensor:
    """8 test scenes as [8, 3, 64, 64] in [0, 1]."""
    data = FashionMNISTScenes("val", subset=8)
    return torch.stack([view_pixels(data[i][0]) for i in range(8)])


def _run(x: torch.Tensor, name: str, severity: int, seed: int = 0) -> torch.Tensor:
    return corrupt(x, name, severity, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_each_corruption_is_seeded_keeps_shape_and_range_and_grows_with_severity(scenes, name):
    distances = []
    for severity in SEVERITIES:
        y = _run(scenes, name, severity)
        assert y.shape == scenes.shape and y.dtype == scenes.dtype
        assert y.min() >= 0 and y.max() <= 1 and torch.isfinite(y).all()
        assert torch.equal(y, _run(scenes, name, severity))  # the same seed, the same images
        assert torch.equal(_run(scenes, name, severity, seed=1), y) == (name not in RANDOM)
        if name == "pixelate":
            # the paper's scales put severity 2 (0.5) on an exact 2x grid, whose mean distance from clean falls
            # below severity 1's (0.6) at 64, 136 and 224 px alike: what grows is the detail lost, counted as
            # the pixels no longer differing from their right neighbour
            distances.append((y.diff(dim=-1) == 0).float().mean().item())
        else:
            distances.append((y - scenes).abs().mean().item())
    assert distances[0] > 0
    assert all(a < b for a, b in zip(distances, distances[1:])), distances  # further from clean at each step
    grey = _run(scenes[:, :1], name, 3)  # one-channel inputs (Fashion-MNIST) too
    assert grey.shape == scenes[:, :1].shape and grey.min() >= 0 and grey.max() <= 1


def test_a_batch_is_corrupted_image_by_image_where_there_is_no_randomness(scenes):
    for name in set(CORRUPTIONS) - RANDOM:
        whole = _run(scenes, name, 4)
        alone = torch.cat([_run(scenes[i : i + 1], name, 4) for i in range(len(scenes))])
        assert torch.allclose(whole, alone, atol=1e-6), name


def test_brightness_and_blur_follow_the_papers_scikit_image_definitions(scenes):
    image = scenes[0].permute(1, 2, 0).numpy().astype(np.float64)
    for severity, shift in zip(SEVERITIES, (0.1, 0.2, 0.3, 0.4, 0.5)):
        hsv = rgb2hsv(image)
        hsv[..., 2] = np.clip(hsv[..., 2] + shift, 0, 1)
        ours = _run(scenes[:1], "brightness", severity)[0].permute(1, 2, 0).numpy()
        np.testing.assert_allclose(ours, np.clip(hsv2rgb(hsv), 0, 1), atol=1e-5)
    # the Gaussian blur up to the borders, where scikit-image repeats the edge pixel
    reference = gaussian(image, sigma=2, channel_axis=-1)
    ours = _run(scenes[:1], "gaussian_blur", 2)[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    for radius, alias in ((3, 0.1), (10, 0.5)):
        kernel = disk_kernel(radius, alias)
        # the paper smooths the normalised disk with OpenCV's reflected border, which adds a little mass where
        # the disk touches the grid's edge (radius 10): kept, as the paper's kernel
        assert kernel.shape[0] == 2 * max(radius, 8) + 1 and abs(kernel.sum().item() - 1) < (
            0.02 if radius > 8 else 1e-5
        )
    contrast = _run(scenes, "contrast", 1)  # the paper keeps each channel's mean (nothing clips at 0.4)
    assert torch.allclose(contrast.mean(dim=(2, 3)), scenes.mean(dim=(2, 3)), atol=1e-5)


def test_pixelates_resampling_is_pils_box_and_nearest_on_odd_sizes():
    # PIL resizes the rows of an identity image: row j becomes input pixel j's weight in each output pixel
    for n_in, n_out in ((97, 58), (131, 78), (61, 24), (83, 20), (37, 11), (7, 4), (7, 2), (5, 3), (20, 33)):
        pixels = Image.fromarray(np.eye(n_in, dtype=np.float32), "F")
        weights = np.asarray(pixels.resize((n_out, n_in), Image.Resampling.BOX)).T
        np.testing.assert_allclose(box_weights(n_in, n_out).numpy(), weights, atol=1e-6, err_msg=f"{n_in}->{n_out}")
        # NEAREST up: the index image resized, a centre exactly on a pixel edge included (2 -> 7: 3.5 * 2/7 = 1)
        index = Image.fromarray(np.arange(n_out, dtype=np.float32)[None], "F")
        taken = np.asarray(index.resize((n_in, 1), Image.Resampling.NEAREST))[0]
        np.testing.assert_array_equal(nearest_indices(n_out, n_in).numpy(), taken, err_msg=f"{n_out}->{n_in}")


def test_corruption_names_and_severities_are_parsed_and_checked():
    assert parse_corruptions(["all:3"]) == [(n, 3) for n in CORRUPTIONS]
    assert parse_corruptions(["contrast", "contrast:2", "pixelate:5"]) == [("contrast", s) for s in SEVERITIES] + [
        ("pixelate", 5)
    ]
    assert len(parse_corruptions(["all"])) == 5 * len(CORRUPTIONS)
    for bad in ("fog", "contrast:6", "contrast:x", "all:0"):
        with pytest.raises(ValueError):
            parse_corruptions([bad])
    with pytest.raises(ValueError, match="severity"):
        corrupt(torch.zeros(1, 3, 8, 8), "contrast", 0, generator=torch.Generator())


def test_mce_is_the_papers_ratio_of_summed_errors():
    def rows(top1s: dict) -> list[dict]:
        return [{"corruption": c, "severity": s + 1, "top1": t} for c, ts in top1s.items() for s, t in enumerate(ts)]

    ours = rows({"blur": [0.8, 0.6], "noise": [0.5, 0.5]})  # errors 0.2+0.4 = 0.6, 0.5+0.5 = 1.0
    base = rows({"blur": [0.7, 0.5], "noise": [0.6, 0.4], "jpeg": [0.1, 0.1]})  # 0.3+0.5 = 0.8, 0.4+0.6 = 1.0
    out = mean_corruption_error(ours, 0.9, base, 0.8)
    assert out["per_corruption"]["blur"]["ce"] == pytest.approx(0.6 / 0.8)
    assert out["per_corruption"]["noise"]["ce"] == pytest.approx(1.0)
    assert out["mce"] == pytest.approx((0.75 + 1.0) / 2)  # jpeg: the model was not swept on it, left out
    # relative: errors above each model's own clean error (0.1 and 0.2)
    assert out["per_corruption"]["blur"]["relative_ce"] == pytest.approx((0.1 + 0.3) / (0.1 + 0.3))
    assert out["per_corruption"]["noise"]["relative_ce"] == pytest.approx((0.4 + 0.4) / (0.2 + 0.4))
    assert out["relative_mce"] == pytest.approx((1.0 + 0.8 / 0.6) / 2)
    assert mean_corruption_error(ours, 0.9, [], 0.8) == {"mce": None, "relative_mce": None, "per_corruption": {}}


def test_cli_sweeps_corruptions_before_normalisation_and_measures_mce(tmp_path, capsys):
    """The command's main in this process (tests/test_evaluate.py runs the `python -m` entry): a fresh interpreter
    for each of the three runs would only add its imports."""
    from cait.evaluate.__main__ import main

    torch.manual_seed(0)
    model = cait.load_model("cait_pico_32", weights=False, img_size=64).model
    ckpt = tmp_path / "m.safetensors"
    cait.save_weights(model, ckpt)
    out = tmp_path / "r.json"
    command = ["--checkpoint", str(ckpt), "--subset", "12", "--workers", "0"]
    command += ["--precision", "fp32", "--corruption", "contrast:5", "gaussian_noise:1", "gaussian_noise:4"]
    code = main([*command, "--json", str(out)])
    run = capsys.readouterr()
    assert code == 0, run.err
    section = json.loads(out.read_text())["corruption"]
    assert [(r["corruption"], r["severity"]) for r in section["rows"]] == [
        ("contrast", 5),
        ("gaussian_noise", 1),
        ("gaussian_noise", 4),
    ]
    assert "CA-1 pt" in run.out and all(r["images"] == 12 for r in section["rows"])
    assert all(0 <= r["ca1_mean_pointing"] <= 1 for r in section["rows"])
    # contrast:5 is the model on the contrast-reduced views, normalised after
    data = FashionMNISTScenes("val", subset=12)
    views = torch.stack([view_pixels(model_view(data[i][0], model.cfg)) for i in range(12)])
    with torch.no_grad():
        logits = model(normalize(_run(views, "contrast", 5), model.cfg.mean, model.cfg.std))
    expected = (logits.argmax(-1) == torch.as_tensor(data.labels)).float().mean().item()
    assert section["rows"][0]["top1"] == pytest.approx(expected)
    # against itself as the baseline (its JSON): every CE is 1
    assert main([*command, "--baseline", str(out)]) == 0
    assert "mCE 100.0%" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        main([*command[:-3], "fog:2"])
    assert bad.value.code == 2 and "unknown corruption" in capsys.readouterr().err


def test_a_sweep_on_an_image_folder_scores_top1_without_pointing(tmp_path):
    from cait.data import ImageFolderData
    from cait.evaluate import corruption_section, evaluate
    from cait.robustness import format_sweep

    rng = np.random.default_rng(0)
    for c, name in enumerate(("cats", "dogs")):
        (tmp_path / "val" / name).mkdir(parents=True)
        for i in range(3):  # photos of odd sizes: the model's view (resize, crop) is what gets corrupted
            pixels = rng.integers(0, 256, (40 + 7 * i, 50, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "val" / name / f"{i}.png")
    torch.manual_seed(0)
    model = cait.load_model("cait_pico_32", weights=False).model
    data = ImageFolderData(tmp_path, "val")
    kwargs = dict(batch_size=4, workers=0, methods=("ca1_mean",))
    clean = evaluate(model, data, **kwargs)
    section = corruption_section(model, data, clean, [("jpeg_compression", 5), ("contrast", 3)], **kwargs)
    assert [r["images"] for r in section["rows"]] == [6, 6]
    assert all("ca1_mean_pointing" not in r for r in section["rows"])  # no boxes, no pointing
    assert "CA-1 pt" not in format_sweep(section) and "jpeg_compression" in format_sweep(section)


def test_a_baseline_checkpoint_is_swept_on_the_same_corrupted_images(tmp_path):
    from cait.evaluate import corruption_section, evaluate

    torch.manual_seed(0)
    model = cait.load_model("cait_pico_32", weights=False, img_size=64).model
    ckpt = tmp_path / "same.safetensors"
    cait.save_weights(model, ckpt)
    data = FashionMNISTScenes("val", subset=8)
    kwargs = dict(batch_size=4, workers=0, methods=("ca1_mean",))
    pairs = [("gaussian_noise", 2), ("defocus_blur", 4)]
    section = corruption_section(model, data, evaluate(model, data, **kwargs), pairs, baseline=str(ckpt), **kwargs)
    # the same weights as the baseline, the same noise draws: every error ratio is exactly 1
    assert section["baseline"]["rows"] == section["rows"]
    assert section["mce"]["mce"] == pytest.approx(1.0) and len(section["mce"]["per_corruption"]) == 2


def _reference(family: str, size: str) -> np.ndarray:
    """The fixture's image(s) as uint8 [n, H, W, 3]: one for "clean", severities 1-5 otherwise."""
    H, W = (int(n) for n in size.split("x"))
    return np.asarray(Image.open(REFERENCE / f"{family}_{size}.png").convert("RGB")).reshape(-1, H, W, 3)


def _ours(family: str, size: str, severity: int) -> np.ndarray:
    """Our corruption of the fixture's clean image in levels 0-255, float64 [H, W, 3]."""
    x = torch.from_numpy(_reference("clean", size).copy()).permute(0, 3, 1, 2).float() / 255
    return _run(x, family, severity)[0].permute(1, 2, 0).double().numpy() * 255


def test_the_fixture_covers_every_family_on_odd_sizes():
    families = {family for family, _ in REFERENCE_CASES}
    assert families == set(CORRUPTIONS), families ^ set(CORRUPTIONS)
    sizes = {size for _, size in REFERENCE_CASES}
    assert len(sizes) == 3 and all(int(n) % 2 for size in sizes for n in size.split("x"))


@pytest.mark.parametrize(("family", "size"), [c for c in REFERENCE_CASES if c[0] not in RANDOM])
def test_deterministic_corruptions_equal_the_reference_package_within_one_level(family, size):
    reference = _reference(family, size)
    for severity, expected in zip(SEVERITIES, reference, strict=True):
        # rounded, ours is within one level of both the package's truncated floats and PIL's two-pass rounding
        worst = np.abs(np.round(_ours(family, size, severity)) - expected).max()
        assert worst <= 1, f"{family} severity {severity} on {size}: up to {worst} levels off"


def _ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    values = np.union1d(a, b)
    cdf = [np.searchsorted(np.sort(v), values, side="right") / len(v) for v in (a, b)]
    return float(np.abs(cdf[0] - cdf[1]).max())


@pytest.mark.parametrize(("family", "size"), [c for c in REFERENCE_CASES if c[0] in RANDOM])
def test_noises_match_the_reference_package_in_distribution(family, size):
    clean = _reference("clean", size)[0].astype(int)
    critical = 1.95 * np.sqrt(2 / clean.size)  # two samples of clean.size values, p = 0.001
    for severity, expected in zip(SEVERITIES, _reference(family, size), strict=True):
        # each value's change from clean, ours truncated as the package's `corrupt` does, against the package's
        theirs = (expected.astype(int) - clean).ravel()
        ours = np.floor(_ours(family, size, severity)).astype(int) - clean
        distance = _ks_distance(ours.ravel(), theirs)
        assert distance < critical, f"{family} severity {severity}: Kolmogorov-Smirnov distance {distance:.3f}"
        # and a distant severity is told apart, so the check has power
        other = np.floor(_ours(family, size, 5 if severity < 4 else 1)).astype(int) - clean
        assert _ks_distance(other.ravel(), theirs) > critical
