"""The Dataset tab in a real browser (the fixtures of test_app_browser): the app started with --atlas shows the
atlas; a click on an exemplar shows that image in the single-image view with the exemplar's head enlarged, and
one selection frame on the page, on the image shown.
The screenshot goes to the temp directory as cait_app_dataset.png."""

from __future__ import annotations

import re
import urllib.request
from io import BytesIO

import pytest
from conftest import randomise_
from PIL import Image
from playwright.sync_api import expect
from test_app_browser import SHOTS, chromium, open_page, start_server, stop_server  # noqa: F401 (a fixture)

import cait
from cait.atlas.__main__ import main as atlas_main
from cait.data import split_name
from cait.data.export import export_scenes


@pytest.fixture(scope="module")
def atlas_server(tmp_path_factory):
    """The app on a random cait_pico_32 checkpoint, started with --atlas: the atlas of 24 exported scenes."""
    root = tmp_path_factory.mktemp("dataset_browser")
    weights = root / "pico.safetensors"
    cait.save_weights(randomise_(cait.load_model("cait_pico_32", weights=False).model, seed=7), weights)
    export_scenes(root / "scenes", n=24, split="val")
    flags = ["--checkpoint", str(weights), "--data", str(root / "scenes"), "--exemplars", "2", "--workers", "0"]
    assert atlas_main([*flags, "--device", "cpu", "--out", str(root / "atlases" / "pico")]) == 0
    proc, url = start_server(["--checkpoint", str(weights), "--atlas", str(root / "atlases" / "pico")], root / "log")
    try:
        yield url, root
    finally:
        stop_server(proc)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def test_an_exemplar_opens_in_the_single_image_view_with_its_head(chromium, atlas_server):  # noqa: F811
    url, root = atlas_server
    page = open_page(chromium, url)
    try:
        page.get_by_role("tab", name="Dataset").click()
        expect(page.locator("#ds_overview")).to_contain_text("24 images")
        expect(page.locator("#ds_exemplars img")).to_have_count(4)  # 2 most concentrated, 2 writing most
        atlas_page = page.locator("#ds_overview a").get_attribute("href")
        assert b"Head atlas" in fetch(page.url.rstrip("/") + atlas_page)  # the link opens atlas.html
        # 59.22: the heads' table with the right/wrong split; a click on a row opens its head
        split = page.locator("#ds_heads_split")
        expect(split).to_contain_text("entropy wrong − right")
        split.get_by_text("CA2 head 1", exact=True).click()
        expect(page.locator("#ds_head input")).to_have_value("CA2 head 1")
        page.locator("#ds_head input").click()
        page.get_by_role("option", name="CA2 head 2").click()
        expect(page.locator("#ds_numbers")).to_contain_text("direct logit attribution")
        page.wait_for_function("() => [...document.querySelectorAll('#ds_exemplars img')].every(i => i.complete)")
        page.screenshot(path=SHOTS / "cait_app_dataset.png", full_page=True)
        caption = page.locator("#ds_exemplars .caption-label").nth(3).inner_text()  # "writes most: 12.png · ..."
        page.locator("#ds_exemplars button.thumbnail-item").nth(3).click()
        expect(page.locator("#ca_big")).to_contain_text("CA2 head 2")  # the Class attention tab, head enlarged
        expect(page.locator("#status")).to_contain_text("Top-1")
        shown = page.locator("#image_in img").get_attribute("src")
        name = caption.split(": ", 1)[1].split(" · ")[0]
        (scene,) = (root / "scenes").glob(f"*/{name}")
        with Image.open(BytesIO(fetch(shown))) as a, Image.open(scene) as b:
            assert a.convert("RGB").tobytes() == b.convert("RGB").tobytes()  # the exemplar's own pixels
        page.screenshot(path=SHOTS / "cait_app_dataset_opened.png", full_page=True)
    finally:
        page.context.close()


def test_the_tab_builds_an_atlas_of_the_test_scenes_and_opens_it(chromium, atlas_server):  # noqa: F811
    page = open_page(chromium, atlas_server[0])
    try:
        page.get_by_role("tab", name="Dataset").click()
        expect(page.locator("#ds_overview")).to_contain_text("24 images")  # --atlas first
        number = page.locator("#ds_scenes input[type=number]")
        number.fill("40")
        number.press("Enter")
        page.locator("#ds_build").click()
        expect(page.locator("#ds_overview")).to_contain_text(split_name("fashion-mnist-scenes", "val"))
        expect(page.locator("#ds_overview")).to_contain_text("40 images")
        expect(page.locator("#ds_pick input")).to_have_value(
            re.compile("^built here: pico.safetensors-[0-9a-f]{8}-val-scenes40$")
        )
        expect(page.locator("#ds_exemplars img")).to_have_count(12)  # the command's default: 6 of each kind
        assert page.locator("#ds_msg").inner_text().strip() == ""  # the page's model made it
    finally:
        page.context.close()


FRAMED_EXEMPLAR, FRAMED_EXAMPLE = "#ds_exemplars .thumbnail-item.selected", "#examples .thumbnail-item.selected"


def test_an_example_clicked_after_an_exemplar_unframes_the_exemplar(chromium, atlas_server):  # noqa: F811
    """One selection frame on the page, on the image shown: an example clicked after an exemplar unframes it."""
    url, _ = atlas_server
    page = open_page(chromium, url)
    try:
        page.get_by_role("tab", name="Dataset").click()
        expect(page.locator("#ds_exemplars img")).to_have_count(4)
        page.locator("#ds_exemplars button.thumbnail-item").nth(1).click()
        expect(page.locator("#status")).to_contain_text("From the atlas")  # opened in the Class attention tab
        expect(page.locator(FRAMED_EXEMPLAR)).to_have_count(1)
        expect(page.locator(FRAMED_EXAMPLE)).to_have_count(0)
        page.locator("#examples button.thumbnail-item").nth(2).click()
        expect(page.locator("#status")).not_to_contain_text("From the atlas")
        expect(page.locator("#status")).to_contain_text("Top-1")
        expect(page.locator(FRAMED_EXAMPLE)).to_have_count(1)
        page.get_by_role("tab", name="Dataset").click()
        expect(page.locator("#ds_exemplars img")).to_have_count(4)  # the exemplars stay
        expect(page.locator(FRAMED_EXEMPLAR)).to_have_count(0)
    finally:
        page.context.close()


def held_build(page, scenes: int) -> list:
    """Holds in the browser the page's next queue request of a build of `scenes` (the list gets its route; the
    test lets it go with `route.continue_()`): the build waits as it would behind another page's work in the
    model queue, whatever the speed of the machine."""
    held: list = []

    def hold(route) -> None:
        if not held and scenes in ((route.request.post_data_json or {}).get("data") or []):
            held.append(route)
        else:
            route.continue_()

    page.route("**/queue/join*", hold)
    return held


def test_a_build_is_stopped_kept_continued_and_downloaded(chromium, atlas_server):  # noqa: F811
    """Issue 49 N42 and N51: Stop is enabled only while this page builds; a Stop pressed while the build waits
    in the model queue ends it when it starts (the page's Stop and its build are one session's), said on the page
    with where the build is kept; building again finishes it; the atlas downloads as a zip. (A Stop during the
    computation, with shards written and continued, is test_dataset_tab's: on this checkpoint a build of 600
    scenes is over in seconds, sooner than a loaded machine's browser clicks.)"""
    import zipfile

    page = open_page(chromium, atlas_server[0])
    try:
        page.get_by_role("tab", name="Dataset").click()
        expect(page.locator("#ds_overview")).to_contain_text("24 images")
        stop = page.locator("#ds_stop")
        expect(stop).to_be_disabled()  # nothing runs here
        expect(page.locator("#ds_where")).to_contain_text("Atlases built here are kept in")
        number = page.locator("#ds_scenes input[type=number]")
        number.fill("600")
        number.press("Enter")
        held = held_build(page, 600)
        page.locator("#ds_build").click()
        expect(stop).to_be_enabled()
        for _ in range(300):  # the build's request, once the Stop is armed (up to 30 s)
            if held:
                break
            page.wait_for_timeout(100)
        assert held, "the build never asked the queue"
        with page.expect_response(lambda r: r.url.endswith("/run/predict")):  # the Stop, off the queue
            stop.click()
        held[0].continue_()
        page.unroute("**/queue/join*")
        expect(page.locator("#ds_msg")).to_contain_text("Stopped", timeout=120_000)
        said = page.locator("#ds_msg").inner_text()
        assert "with 0 of 600 scenes done" in said and "val-scenes600" in said
        expect(stop).to_be_disabled()
        page.locator("#ds_build").click()
        expect(page.locator("#ds_overview")).to_contain_text("600 images", timeout=300_000)
        expect(stop).to_be_disabled()
        with page.expect_download() as download:
            page.locator("#ds_download").click()
        assert download.value.suggested_filename.endswith("-val-scenes600.zip")
        with zipfile.ZipFile(download.value.path()) as z:
            summary = next(n for n in z.namelist() if n.endswith("/summary.json"))
            assert b'"images": 600' in z.read(summary)
    finally:
        page.context.close()
