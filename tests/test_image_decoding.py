"""One image decoder (`cait.data.image_file`): the same odd files (EXIF rotations, transparency, 16-bit grey and
RGB, palettes, CMYK, an animation, WebP, float TIFFs, 1-bit, a large long JPEG) read by every path that opens an
image file give identical model inputs: the app's upload, the reader (`read_images`, which evaluate reads
through), the atlas's data, the Dataset tab's exemplar opened in the app, the analysis scripts' images, the
Causal tab's mean-ablation reference and training's ImageFolder. The decoder's rules against numpy; a damaged
file keeps its one-line error everywhere."""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import cait
from app import causal_view, session
from app.images import ImageInputError
from cait.data import read_images
from cait.preprocess import model_view, normalise, view_tensor

ANALYSIS = Path(__file__).resolve().parent.parent / "analysis"
CONFIGS = [cait.get_config("cait_pico_32"), cait.get_config("cait_nano_28")]  # RGB and grey models


def _smooth(h: int, w: int, channels: int, seed: int) -> np.ndarray:
    """Smooth random colours in [0, 1] [h, w, channels]: a picture whose every region differs."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    waves = [np.sin(x * rng.uniform(2, 9) + y * rng.uniform(2, 9) + rng.uniform(0, 6)) for _ in range(channels)]
    return (np.stack(waves, -1) + 1) / 2


def _png16_rgb(values: np.ndarray) -> bytes:
    """A 16-bit RGB PNG written by hand (numpy + zlib; PIL writes no 16-bit RGB PNG): IHDR bit depth 16, colour
    type 2, each row filter 0 then big-endian samples."""
    h, w, _ = values.shape
    rows = b"".join(b"\0" + values[i].astype(">u2").tobytes() for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _exif(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


def odd_files(folder: Path) -> dict[str, np.ndarray | None]:
    """The odd files written to `folder`: {name: the array it was made from (None when it was drawn)}."""
    folder.mkdir(parents=True, exist_ok=True)
    rgb = (_smooth(24, 40, 3, 0) * 255).astype(np.uint8)
    made: dict[str, np.ndarray | None] = {"rot6.jpg": rgb, "rot8.png": rgb}
    Image.fromarray(rgb).save(folder / "rot6.jpg", exif=_exif(6), quality=95)
    Image.fromarray(rgb).save(folder / "rot8.png", exif=_exif(8))
    rgba = (_smooth(30, 30, 4, 1) * 255).astype(np.uint8)
    rgba[:, :10, 3] = 0  # a fully transparent band over colours that must not show
    made["rgba.png"] = made["alpha.webp"] = rgba
    Image.fromarray(rgba, "RGBA").save(folder / "rgba.png")
    Image.fromarray(rgba, "RGBA").save(folder / "alpha.webp", lossless=True)
    made["la.png"] = rgba[..., [0, 3]]
    Image.fromarray(rgba[..., [0, 3]], "LA").save(folder / "la.png")
    made["grey16.png"] = made["grey16.tif"] = grey16 = (_smooth(33, 21, 1, 2)[..., 0] * 65535).astype(np.uint16)
    Image.fromarray(grey16).save(folder / "grey16.png")
    Image.fromarray(grey16).save(folder / "grey16.tif")
    made["rgb16.png"] = rgb16 = (_smooth(20, 26, 3, 3) * 65535).astype(np.uint16)
    (folder / "rgb16.png").write_bytes(_png16_rgb(rgb16))
    palette = Image.fromarray(rgba, "RGBA").convert("P")
    palette.save(folder / "palette.png", transparency=palette.getpixel((2, 2)))
    made["palette.png"] = None
    Image.fromarray(rgb).convert("CMYK").save(folder / "cmyk.jpg", quality=95)
    made["cmyk.jpg"] = None
    frames = [Image.new("RGB", (18, 18), c) for c in ((220, 30, 20), (0, 255, 0), (0, 0, 255))]
    frames[0].save(folder / "anim.gif", save_all=True, append_images=frames[1:], duration=50, loop=0)
    made["anim.gif"] = None
    made["float01.tif"] = float01 = _smooth(25, 25, 1, 4)[..., 0].astype(np.float32) * 0.6 + 0.2
    Image.fromarray(float01, "F").save(folder / "float01.tif")
    made["float_wide.tif"] = wide = _smooth(25, 25, 1, 5)[..., 0].astype(np.float32) * 10 - 3
    Image.fromarray(wide, "F").save(folder / "float_wide.tif")
    Image.fromarray(rgb[..., 0] > 128).save(folder / "bits1.png")
    made["bits1.png"] = None
    big = (_smooth(1100, 4300, 3, 6) * 255).astype(np.uint8)  # over 2 * MAX_SIDE, longer than MAX_ASPECT
    Image.fromarray(big).save(folder / "big_long.jpg", exif=_exif(3), quality=90)
    made["big_long.jpg"] = None
    return made


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("odd")
    made = odd_files(root / "val" / "odd")  # a class folder, as training's ImageFolder needs one
    return root / "val" / "odd", made


def _every_path(path: Path, cfg, reader, atlas, training, tmp: Path) -> dict[str, torch.Tensor]:
    """The model input [C, H, W] each path makes of the image file `path`."""
    sys.path.insert(0, str(ANALYSIS))
    try:
        from _common import load_examples
    finally:
        sys.path.remove(str(ANALYSIS))
    i = reader.paths.index(path.name)
    exemplar = tmp / f"{path.stem}_exemplar.png"  # the Dataset tab opens an exemplar in the app as a PNG it saves
    reader.image(i).save(exemplar)
    seen = {
        "app": session.model_input(str(path), cfg)[2][0],
        "reader": reader[i][0],
        "atlas": normalise(atlas[i][0], cfg),
        "dataset tab exemplar": session.model_input(str(exemplar), cfg)[2][0],
        "analysis": view_tensor(load_examples([path], cfg)[0].image.convert("RGB" if cfg.in_chans == 3 else "L"), cfg),
        "causal reference": causal_view.reference_batch([str(path)], cfg)[0],
    }
    if path.suffix != ".gif":  # torchvision's ImageFolder takes no GIF
        files = [Path(p).name for p, _ in training.folder.samples]
        seen["training"] = view_tensor(model_view(training[files.index(path.name)][0], cfg), cfg)
    return seen


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.in_chans}ch")
def test_every_path_reads_the_odd_files_alike(folder, cfg, tmp_path):
    from cait.atlas.run import read_data
    from cait.data import ImageFolderData

    where, made = folder
    reader = read_images(str(where), cfg)
    atlas = read_data(SimpleNamespace(data=str(where), boxes=None, limit=None, sample="stratified"), cfg)
    training = ImageFolderData(where.parent.parent, "val")
    assert sorted(reader.paths) == sorted(made)
    for name in made:
        seen = _every_path(where / name, cfg, reader, atlas, training, tmp_path)
        differ = [path for path, x in seen.items() if not torch.equal(x, seen["app"])]
        assert not differ, f"{name}: {differ} read it unlike the app"
        assert seen["app"].shape == (cfg.in_chans, cfg.img_size, cfg.img_size)


def _decoded(path: Path, mode: str = "RGB") -> np.ndarray:
    from cait.data.image_file import read_image

    return np.asarray(read_image(path, mode=mode)).astype(np.int64)


def test_the_decoders_rules_against_numpy(folder):
    """EXIF rotation as the tag says (6: shown turned 90 degrees clockwise, 8: anticlockwise), alpha on white,
    16-bit grey rounded, floats in [0, 1] times 255 and others stretched, the first frame of a GIF; 16-bit RGB
    arrives as PIL's high byte of each sample."""
    where, made = folder
    rot8 = _decoded(where / "rot8.png")
    np.testing.assert_array_equal(rot8, np.rot90(made["rot8.png"], k=1))  # np.rot90's k=1: anticlockwise
    with Image.open(where / "rot6.jpg") as im:
        stored = np.asarray(im.convert("RGB")).astype(np.int64)
    np.testing.assert_array_equal(_decoded(where / "rot6.jpg"), np.rot90(stored, k=-1))
    rgba = made["rgba.png"].astype(np.float64)
    on_white = rgba[..., :3] * rgba[..., 3:] / 255 + 255 * (1 - rgba[..., 3:] / 255)
    for name in ("rgba.png", "alpha.webp"):
        assert np.abs(_decoded(where / name) - on_white).max() <= 1, name
    assert (_decoded(where / "rgba.png")[:, :10] == 255).all()  # the transparent band is white
    for name in ("grey16.png", "grey16.tif"):
        np.testing.assert_array_equal(_decoded(where / name, "L"), np.floor(made[name] / 65535 * 255 + 0.5))
    np.testing.assert_array_equal(_decoded(where / "rgb16.png"), made["rgb16.png"] >> 8)
    np.testing.assert_array_equal(_decoded(where / "float01.tif", "L"), np.floor(made["float01.tif"] * 255.0 + 0.5))
    wide = made["float_wide.tif"].astype(np.float64)
    stretched = np.floor((wide - wide.min()) / (wide.max() - wide.min()) * 255 + 0.5)
    np.testing.assert_array_equal(_decoded(where / "float_wide.tif", "L"), stretched)
    r, g, b = _decoded(where / "anim.gif")[9, 9]
    assert r > 200 and g < 60 and b < 60


def test_a_damaged_file_keeps_its_one_line_error_on_every_path(tmp_path, capsys):
    """A truncated PNG and a 32-bit integer image beyond 16 bits (no 8-bit scale): the app's message, the
    reader's skip reason, the analysis scripts' one-line exit."""
    full = tmp_path / "full.png"
    Image.fromarray((_smooth(64, 64, 3, 7) * 255).astype(np.uint8)).save(full)
    (tmp_path / "cut.png").write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    full.unlink()
    Image.fromarray(np.full((8, 8), 70000, np.int32), "I").save(tmp_path / "wide.tif")
    cfg = CONFIGS[0]
    reader = read_images(str(tmp_path), cfg)
    said = {"cut.png": "truncated", "wide.tif": "has no 8-bit scale"}
    for name, words in said.items():
        with pytest.raises(ImageInputError, match=words) as caught:
            session.model_input(str(tmp_path / name), cfg)
        assert "\n" not in str(caught.value)
        i = reader.paths.index(name)
        assert not reader[i][4] and words.split()[0] in reader.skip_reason(i)
        sys.path.insert(0, str(ANALYSIS))
        try:
            from _common import load_examples

            with pytest.raises(SystemExit, match="2"):
                load_examples([tmp_path / name], cfg)
        finally:
            sys.path.remove(str(ANALYSIS))
        assert capsys.readouterr().err.count("\n") == 1
