"""The app: safe decoding of every odd upload, model loading, and the running server's /analyze API
(answers equal a direct model call, 8 simultaneous requests each get their own answer, bad files get
a message and the server keeps serving)."""

from __future__ import annotations

import io
import logging
import os
import socket
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import randomise_
from PIL import Image

import cait
from cait import explain
from cait.data import image_file

ROOT = Path(__file__).resolve().parents[1]

from app import torch_thread  # noqa: E402
from app.examples import find_examples  # noqa: E402
from app.images import ImageInputError, load_image  # noqa: E402
from app.loading import load_page_model as load_choice  # noqa: E402
from app.models import ModelCache, ModelChoice  # noqa: E402
from app.session import analyse  # noqa: E402
from app.ui import build_app, launch  # noqa: E402

CPU = torch.device("cpu")


def load_model(name, checkpoint, device=CPU):
    return load_choice(ModelChoice(name=name, checkpoint=checkpoint, random_init=True), device)


# ------------------------------------------------------------------------------ odd image files


def png_claiming(width: int, height: int) -> bytes:
    """A tiny valid PNG whose header claims width x height (a decompression bomb's header)."""
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    data[16:24] = struct.pack(">II", width, height)  # IHDR width, height
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # IHDR CRC over type + data
    return bytes(data)


def save(image: Image.Image, path: Path, **kw) -> Path:
    image.save(path, **kw)
    return path


def gradient(w: int, h: int) -> np.ndarray:
    return np.add.outer(np.arange(h), np.arange(w)).astype(np.float64) / (w + h - 2)


def test_grey_cmyk_and_palette_become_rgb(tmp_path):
    grey = save(Image.fromarray((gradient(40, 30) * 255).astype(np.uint8), "L"), tmp_path / "grey.png")
    cmyk = save(Image.new("CMYK", (30, 30), (0, 255, 255, 0)), tmp_path / "cmyk.jpg", quality=95)  # red
    palette = save(Image.new("RGB", (30, 30), (0, 0, 255)).convert("P"), tmp_path / "palette.png")
    for path in (grey, cmyk, palette):
        out = load_image(path)
        assert out.image.mode == "RGB" and out.image.size == Image.open(path).size
    r, g, b = load_image(cmyk).image.getpixel((15, 15))
    assert r > 200 and g < 60 and b < 60
    assert load_image(palette).image.getpixel((3, 3)) == (0, 0, 255)
    assert load_image(grey, mode="L").image.mode == "L"


def test_transparency_goes_on_white(tmp_path):
    rgba = Image.new("RGBA", (20, 20), (255, 0, 0, 0))  # fully transparent red: must not show as red
    rgba.paste((0, 0, 255, 255), (0, 0, 10, 20))
    out = load_image(save(rgba, tmp_path / "rgba.png"))
    assert out.image.getpixel((15, 5)) == (255, 255, 255)
    assert out.image.getpixel((5, 5)) == (0, 0, 255)
    assert any("transparent" in n for n in out.notes)
    palette = rgba.convert("P")  # palette with a transparent index
    palette.info["transparency"] = palette.getpixel((15, 5))
    assert load_image(save(palette, tmp_path / "p.png", transparency=palette.info["transparency"])).image.getpixel(
        (15, 5)
    ) == (255, 255, 255)


def test_16_bit_is_rescaled_not_clipped(tmp_path):
    data = (gradient(64, 16) * 65535).astype(np.uint16)
    out = load_image(save(Image.fromarray(data), tmp_path / "deep.png"))
    values = np.asarray(out.image.convert("L"), dtype=float)
    assert values.min() <= 1 and values.max() >= 254  # full range kept
    assert abs(values[8, 32] - 255 * gradient(64, 16)[8, 32]) < 2  # middle grey stays middle grey
    assert any("bit depth" in n for n in out.notes)


def test_exif_rotation_is_applied(tmp_path):
    image = Image.new("RGB", (40, 20), (0, 200, 0))
    image.paste((200, 0, 0), (0, 0, 10, 20))  # red band on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    out = load_image(save(image, tmp_path / "rot.jpg", exif=exif, quality=95))
    assert out.image.size == (20, 40)
    r, g, _ = out.image.getpixel((10, 3))  # the left band is now at the top
    assert r > 150 and g < 80
    assert any("EXIF" in n for n in out.notes)


def test_animated_gif_uses_first_frame(tmp_path):
    frames = [Image.new("RGB", (16, 16), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0)
    out = load_image(path)
    r, g, b = out.image.getpixel((8, 8))
    assert r > 200 and g < 50 and b < 50
    assert any("3 frames" in n for n in out.notes)


@pytest.mark.parametrize("size", [(1, 1), (3000, 2), (2, 3000), (3000, 2000)])
def test_tiny_huge_and_elongated_images_give_bounded_model_input(tmp_path, size):
    out = load_image(save(Image.new("RGB", size, (10, 120, 200)), tmp_path / "odd.png"))
    w, h = out.image.size
    assert max(w, h) <= image_file.MAX_SIDE and max(w, h) <= image_file.MAX_ASPECT * min(w, h) + 1
    x = cait.preprocess.to_batch([out.image], cait.get_config("cait_pico_32"))
    assert x.shape == (1, 3, 32, 32)
    assert torch.allclose(x[0, 2], x[0, 2, 0, 0])  # a flat colour stays flat
    if min(size) == 1:
        assert any("upscaled" in n for n in out.notes)


def test_elongated_crop_keeps_what_the_model_sees(tmp_path):
    """Cropping to MAX_ASPECT first must not change the model input (the eval transform keeps the
    central square anyway)."""
    rng = np.random.default_rng(0)
    strip = Image.fromarray(rng.integers(0, 255, (40, 400, 3), dtype=np.uint8))
    cfg = cait.get_config("cait_pico_32")
    direct = cait.preprocess.to_batch([strip], cfg)
    via_app = cait.preprocess.to_batch([load_image(save(strip, tmp_path / "strip.png")).image], cfg)
    assert (direct - via_app).abs().max() < 0.05


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("empty.png", b"", "empty"),
        ("text.png", b"this is not an image\n" * 50, "not an image"),
        ("bomb.png", png_claiming(10_000, 10_000), "megapixels"),  # above our limit
        ("giant.png", png_claiming(40_000, 40_000), "megapixels"),  # above Pillow's own bomb limit
    ],
)
def test_unreadable_files_get_a_clear_message(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ImageInputError, match=message):
        load_image(path)


def test_a_file_over_the_upload_limit_is_refused_unread(tmp_path):
    from app.images import MAX_UPLOAD_MB

    big = tmp_path / "big.png"
    big.write_bytes(png_claiming(64, 64))
    os.truncate(big, int((MAX_UPLOAD_MB + 0.5) * 2**20))  # sparse: a real header, then zeros no decoder reaches
    with pytest.raises(ImageInputError, match=rf"20\.5 MB, larger than this app's limit of {MAX_UPLOAD_MB} MB"):
        load_image(big)
    os.truncate(big, MAX_UPLOAD_MB * 2**20)  # at the limit: read (and found truncated)
    with pytest.raises(ImageInputError, match="truncated"):
        load_image(big)


def test_truncated_file_gets_a_clear_message(tmp_path):
    rng = np.random.default_rng(0)
    full = save(Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)), tmp_path / "full.png")
    cut = tmp_path / "cut.png"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    with pytest.raises(ImageInputError, match="truncated"):
        load_image(cut)


# ------------------------------------------------------------------------------- model loading


def test_model_without_weights_is_flagged_untrained_and_reproducible():
    a, b = load_model("cait_pico_32", None), load_model("cait_pico_32", None)
    assert a.notice.startswith("Untrained") and a.source.startswith("random init")
    for (k, va), vb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(va, vb), k


def test_checkpoint_loading_and_bad_checkpoint(tmp_path):
    model = randomise_(cait.load_model("cait_pico_32", weights=False).model)
    path = tmp_path / "pico.safetensors"
    cait.save_weights(model, path)
    loaded = load_model(None, str(path))
    assert loaded.notice == "" and "pico.safetensors" in loaded.source
    assert torch.equal(loaded.model.head.weight, model.head.weight)
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"garbage")
    with pytest.raises(cait.CheckpointError):
        load_model("cait_pico_32", str(bad))


def test_an_imagenet_model_has_imagenet_labels_and_photos():
    cache = ModelCache(lambda choice: load_choice(choice, CPU), max_bytes=2**40)
    before = cache.get(ModelChoice("cait_pico_32", random_init=True))
    loaded = cache.get(ModelChoice("cait_xxs24_224", random_init=True))
    assert (
        cache.cached == [ModelChoice("cait_pico_32", random_init=True), ModelChoice("cait_xxs24_224", random_init=True)]
        and before.uid != loaded.uid
    )
    assert len(loaded.labels) == 1000 and loaded.labels[281].startswith("tabby")
    names = [Path(p).stem for p, _ in loaded.examples]
    assert {"chelsea", "astronaut", "coffee", "rocket"} <= set(names) and len(loaded.examples) >= 6
    assert len(names) == len(set(names)), names  # each photo once, however many roots hold it
    for path, _ in loaded.examples:
        assert min(Image.open(path).size) > 200  # real photos, not icons
    a = analyse(loaded, next(p for p, _ in loaded.examples if "chelsea" in p))
    assert a.ca_maps.shape == (2, 4, 14, 14) and a.view.size == (224, 224)


# -------------------------------------------------------------------------- the running server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The real app (uvicorn on a free port, in a thread of this process) with known random weights
    (non-uniform attention); `loaded` is the same model for direct calls. The browser test starts it
    as a user does, `python app/main.py`."""
    from gradio_client import Client

    tmp = tmp_path_factory.mktemp("app")
    ckpt = tmp / "nano.safetensors"
    cait.save_weights(randomise_(cait.load_model("cait_nano_64", weights=False).model), ckpt)
    choice = ModelChoice(name=None, checkpoint=str(ckpt))
    cache = ModelCache(lambda c: load_choice(c, CPU), max_bytes=2**30)
    loaded = cache.get(choice)
    demo = build_app(cache, choice)
    port = free_port()
    launch(demo, port=port, block=False)
    try:
        url = f"http://127.0.0.1:{port}/"
        yield {"client": Client(url, verbose=False), "url": url, "loaded": loaded, "tmp": tmp}
    finally:
        demo.close()


def test_server_binds_localhost_and_documents_analyze(server):
    assert server["url"].startswith("http://127.0.0.1:")
    api = server["client"].view_api(return_format="dict", print_info=False)
    assert "/analyze" in api["named_endpoints"]
    assert [p["parameter_name"] for p in api["named_endpoints"]["/analyze"]["parameters"]][:2] == ["image", "method"]


def test_analyze_publishes_its_keywords_and_defaults(server):
    """The API's signature is a promise to its callers: every keyword, in order, with its default."""
    api = server["client"].view_api(return_format="dict", print_info=False)
    parameters = api["named_endpoints"]["/analyze"]["parameters"]
    published = [(p["parameter_name"], p.get("parameter_default")) for p in parameters]
    options = explain.MethodOptions()
    assert published == [
        ("image", None),
        ("method", ""),
        ("target", -1),
        ("ig_steps", options.ig_steps),
        ("causal", False),
        ("ig_baseline", options.ig_baseline),
        ("signed", options.signed),
        ("smoothgrad_samples", options.smoothgrad_samples),
        ("smoothgrad_stdev", options.smoothgrad_stdev),
        ("rollout_head_fusion", options.rollout_head_fusion),
        ("rollout_discard_ratio", options.rollout_discard_ratio),
        ("seed", 0),
        ("logit_lens", False),
        ("patching", ""),
        ("token_patching", ""),
        ("token_region", 1),
    ]


def scene_images(tmp: Path, n: int) -> list[Path]:
    """n different test images: the shipped example scenes, padded with random colour scenes."""
    shipped = sorted((Path(cait.__file__).parent / "examples").glob("scene_*.png"))[:n]
    rng = np.random.default_rng(1)
    extra = []
    for i in range(n - len(shipped)):
        extra.append(save(Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)), tmp / f"rand{i}.png"))
    return shipped + extra


def direct(loaded, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities [K] and class-attention maps [L, h, g, g] by calling the model directly."""
    x = cait.preprocess.to_batch([load_image(path).image], loaded.cfg)
    with torch.no_grad():
        ca = explain.class_attention(loaded.model, x)
        probs = loaded.model(x).softmax(-1)[0]
    return probs.numpy(), ca.maps[0].numpy()


def check_answer(answer: dict, loaded, path: Path) -> None:
    probs, maps = direct(loaded, path)
    np.testing.assert_allclose(answer["probabilities"], probs, atol=1e-5)
    np.testing.assert_allclose(np.array(answer["class_attention"]["maps"]), maps, atol=1e-5)
    top = answer["predictions"]
    assert len(top) == 5 and top[0]["index"] == int(probs.argmax())
    assert top[0]["label"] == loaded.labels[top[0]["index"]]


def test_analyze_equals_a_direct_model_call(server):
    from gradio_client import handle_file

    path = scene_images(server["tmp"], 1)[0]
    answer = server["client"].predict(handle_file(str(path)), api_name="/analyze")
    check_answer(answer, server["loaded"], path)
    cfg = server["loaded"].cfg
    assert np.array(answer["class_attention"]["maps"]).shape == (2, cfg.num_heads, cfg.grid_size, cfg.grid_size)
    assert "attribution" not in answer  # only what was asked for
    assert np.array(answer["class_attention"]["entropy"]).shape == (2, cfg.num_heads)
    assert np.array(answer["self_attention"]["mean_distance"]).shape == (cfg.depth, cfg.num_heads)
    # the same answer as the in-process analysis the UI uses
    a = analyse(server["loaded"], str(path))
    np.testing.assert_allclose(answer["residual_ratios"]["sa"], a.ratios["sa"], rtol=1e-5)


def test_analyze_runs_the_asked_attribution(server):
    from gradio_client import handle_file

    path = scene_images(server["tmp"], 1)[0]
    answer = server["client"].predict(handle_file(str(path)), "saliency", 3, 32, api_name="/analyze")
    loaded = server["loaded"]
    x = cait.preprocess.to_batch([load_image(path).image], loaded.cfg)
    expected = explain.METHODS["saliency"](loaded.model, x, torch.tensor([3]))[0]
    assert answer["attribution"]["method"] == "saliency" and answer["attribution"]["target"] == 3
    np.testing.assert_allclose(np.array(answer["attribution"]["patch"]), expected.numpy(), rtol=1e-4, atol=1e-6)
    with pytest.raises(Exception, match="unknown method"):
        server["client"].predict(handle_file(str(path)), "telepathy", api_name="/analyze")


def test_analyze_takes_the_method_options_by_name_and_a_seed(server):
    from gradio_client import handle_file

    path = handle_file(str(scene_images(server["tmp"], 1)[0]))
    options = dict(smoothgrad_samples=4, smoothgrad_stdev=0.4, signed=True)
    call = lambda seed: server["client"].predict(
        path, method="smoothgrad", target=2, seed=seed, **options, api_name="/analyze"
    )["attribution"]
    first, again, other = call(5), call(5), call(6)
    assert first["patch"] == again["patch"] and first["patch"] != other["patch"]
    assert first["options"] == {**explain.MethodOptions(**options).as_dict(), "seed": 5}
    assert np.min(first["patch"]) < 0  # signed, as asked (|attribution| is never negative)
    rollout = server["client"].predict(
        path, method="rollout_raw", rollout_head_fusion="max", rollout_discard_ratio=0.5, api_name="/analyze"
    )["attribution"]
    loaded = server["loaded"]
    x = cait.preprocess.to_batch([load_image(scene_images(server["tmp"], 1)[0]).image], loaded.cfg)
    expected = explain.rollout(loaded.model, x, stage="raw", head_fusion="max", discard_ratio=0.5)[0]
    np.testing.assert_allclose(np.array(rollout["patch"]), expected.numpy(), rtol=1e-4, atol=1e-6)
    with pytest.raises(Exception, match="baseline"):
        server["client"].predict(path, method="integrated_gradients", ig_baseline="plaid", api_name="/analyze")


def test_analyze_gives_the_causal_numbers_when_asked(server):
    from gradio_client import handle_file

    path = scene_images(server["tmp"], 1)[0]
    answer = server["client"].predict(handle_file(str(path)), "", 3, 32, True, api_name="/analyze")
    loaded = server["loaded"]
    x = cait.preprocess.to_batch([load_image(path).image], loaded.cfg)
    dla = explain.direct_logit_attribution(loaded.model, x, torch.tensor([3]))
    causal = answer["causal"]
    assert causal["target"] == 3 and "attribution" not in answer
    np.testing.assert_allclose(np.array(causal["heads"]), dla.heads[0].numpy(), rtol=1e-4, atol=1e-5)
    assert sum(causal["parts"].values()) == pytest.approx(causal["target_logit"], abs=1e-3)
    assert causal["parts"]["CA1 heads"] == pytest.approx(np.sum(causal["heads"][0]), abs=1e-4)
    knockout = explain.knockout_profile(loaded.model, x, torch.tensor([3]))[0]
    np.testing.assert_allclose([b["knockout_delta_logit"] for b in causal["blocks"]], knockout, rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="target must be"):
        server["client"].predict(handle_file(str(path)), "", 99, 32, True, api_name="/analyze")


def test_analyze_gives_the_lens_and_patching_by_keyword(server):
    from gradio_client import handle_file

    from cait.corruptions import corrupt

    path = scene_images(server["tmp"], 1)[0]
    client, loaded = server["client"], server["loaded"]
    answer = client.predict(handle_file(str(path)), logit_lens=True, patching="contrast:2", api_name="/analyze")
    assert "causal" not in answer and "attribution" not in answer
    x = cait.preprocess.to_batch([load_image(path).image], loaded.cfg)
    target = int(np.argmax(answer["probabilities"]))
    lens = explain.logit_lens(loaded.model, x).softmax(-1)[0, :, target]
    np.testing.assert_allclose(answer["logit_lens"]["probability"], lens.numpy(), atol=1e-5)
    pixels = cait.preprocess.view_pixels(cait.preprocess.model_view(load_image(path).image, loaded.cfg))[None]
    broken = cait.preprocess.normalise(
        corrupt(pixels, "contrast", 2, generator=torch.Generator().manual_seed(0)), loaded.cfg
    )
    want = explain.activation_patching(loaded.model, x, broken, torch.tensor([target]), granularity="head")
    np.testing.assert_allclose(np.array(answer["patching"]["heads"]), want.heads[0].numpy(), atol=1e-4)
    with pytest.raises(Exception, match="NAME:SEVERITY"):
        client.predict(handle_file(str(path)), patching="contrast", api_name="/analyze")


def test_the_served_app_runs_its_torch_work_on_one_thread(server, monkeypatch):
    """All model work on app.torch_thread's thread, with one-image threads (a second thread calling torch
    made every call ~3x slower); this test process's own direct calls run elsewhere."""
    from gradio_client import handle_file

    from app import session

    seen = []

    def recording(*args, **kwargs):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return analyse(*args, **kwargs)

    monkeypatch.setattr(session, "analyse", recording)
    path = scene_images(server["tmp"], 1)[0]
    for _ in range(2):
        server["client"].predict(handle_file(str(path)), api_name="/analyze")
    assert len(seen) == 2 and all(name.startswith("cait-torch") for name, _ in seen)
    assert {threads for _, threads in seen} == {torch_thread.interactive_threads()}


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_eight_simultaneous_requests_get_their_own_answers(server):
    from gradio_client import handle_file

    paths = scene_images(server["tmp"], 8)
    client = server["client"]

    def burst() -> list[dict]:
        jobs = [client.submit(handle_file(str(p)), api_name="/analyze") for p in paths]
        return [job.result(timeout=120) for job in jobs]

    first = burst()
    rss_after_first = rss_mb()
    for answer, path in zip(first, paths):
        check_answer(answer, server["loaded"], path)
    with ThreadPoolExecutor(8) as pool:  # also from 8 threads at once
        second = list(pool.map(lambda p: client.predict(handle_file(str(p)), api_name="/analyze"), paths))
    for answer, path in zip(second, paths):
        check_answer(answer, server["loaded"], path)
    # memory is bounded: a second round of the same load does not keep growing the server
    assert rss_mb() - rss_after_first < 200


def test_bad_uploads_get_messages_and_the_server_keeps_serving(server):
    from gradio_client import handle_file

    tmp, client = server["tmp"], server["client"]
    cases = {
        "empty.png": (b"", "empty"),
        "notes.jpg": (b"hello " * 100, "not an image"),
        "bomb.png": (png_claiming(12_000, 12_000), "megapixels"),
    }
    for name, (content, message) in cases.items():
        (tmp / name).write_bytes(content)
        with pytest.raises(Exception, match=message):
            client.predict(handle_file(str(tmp / name)), api_name="/analyze")
    rgba = save(Image.new("RGBA", (30, 50), (0, 0, 0, 0)), tmp / "clear.png")
    answer = client.predict(handle_file(str(rgba)), api_name="/analyze")
    assert any("transparent" in n for n in answer["image"]["notes"])
    check_answer(answer, server["loaded"], rgba)


def test_a_bad_analyze_call_logs_one_line(server, capfd, caplog):
    from gradio_client import handle_file

    tmp, client = server["tmp"], server["client"]
    (tmp / "words.png").write_bytes(b"hello " * 100)
    image = handle_file(str(scene_images(tmp, 1)[0]))
    capfd.readouterr()
    caplog.set_level(logging.INFO, logger="cait.app")
    bad = {
        "not an image": dict(image=handle_file(str(tmp / "words.png"))),
        "unknown method": dict(image=image, method="telepathy"),
        "target must be": dict(image=image, method="saliency", target=10_000),
        "ig_steps must be between 4 and 128": dict(image=image, method="integrated_gradients", ig_steps=1000),
        "smoothgrad_stdev must be between 0 and 1": dict(image=image, method="smoothgrad", smoothgrad_stdev=-1),
    }
    for message, call in bad.items():
        with pytest.raises(Exception, match=message):
            client.predict(**call, api_name="/analyze")
    assert "Traceback" not in capfd.readouterr().err
    lines = [r.getMessage() for r in caplog.records if r.name == "cait.app" and "refused" in r.getMessage()]
    assert len(lines) == len(bad) and all("\n" not in line for line in lines)


def test_uploads_above_the_size_limit_are_refused(server):
    """Over the limit, the file is refused by the handler, with the UI's message; over what the server takes at
    all (`images.MAX_RECEIVED_MB`), by the server before any handler runs."""
    from gradio_client import handle_file

    from app.images import MAX_RECEIVED_MB, MAX_UPLOAD_MB

    big = server["tmp"] / "big.png"
    big.write_bytes(b"\0" * ((MAX_UPLOAD_MB + 1) * 2**20))
    with pytest.raises(Exception, match=f"larger than this app's limit of {MAX_UPLOAD_MB} MB"):
        server["client"].predict(handle_file(str(big)), api_name="/analyze")
    os.truncate(big, (MAX_RECEIVED_MB + 1) * 2**20)
    with pytest.raises(Exception, match="(?i)maximum (allowed |file )?size|413"):
        server["client"].predict(handle_file(str(big)), api_name="/analyze")
    path = scene_images(server["tmp"], 1)[0]  # and the next request is served
    check_answer(server["client"].predict(handle_file(str(path)), api_name="/analyze"), server["loaded"], path)


def test_examples_match_the_model_kind():
    from app.workdir import WORK

    scenes = find_examples(cait.get_config("cait_nano_64"), WORK.path)
    grey = find_examples(cait.get_config("cait_nano_28"), WORK.path)
    names = [Path(p).name for p, _ in scenes]  # the example scenes, then the product-style photos (issue 48)
    assert len(names) == 14 and all(n.startswith("scene_") for n in names[:12])
    assert all(n.startswith("product_") for n in names[12:])
    assert grey and all(Path(p).name.startswith("fashion-mnist-") for p, _ in grey)
    with Image.open(grey[0][0]) as im:
        assert im.size == (28, 28) and im.mode == "L"
    assert all(caption.startswith("true: ") for _, caption in scenes + grey)
