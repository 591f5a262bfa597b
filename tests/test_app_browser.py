"""The app in a real browser (Debian's headless Chromium through Playwright): pick an example, see the
predictions, the attention grid, the saliency maps and the LayerScale plot, switch the colormap, upload
a bad file and see the message; the page makes no request outside this machine.
Screenshots go to the temp directory as cait_app_*.png, to look at after a run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import wait_until_served
from playwright.sync_api import expect, sync_playwright
from test_app import ROOT, free_port

import cait

SHOTS = Path(tempfile.gettempdir())  # where the screenshots go

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
TIMEOUT = 180_000  # ms; generous: on a shared machine at load 20, one analysis and its follow-up took over 90 s
expect.set_options(timeout=TIMEOUT)


def start_server(
    args: list[str], log: Path, *, gate: Path | None = None, holds: tuple[str, ...] = ("causal", "mechanisms")
) -> tuple[subprocess.Popen, str]:
    """`python app/main.py ARGS` on a free port; returns (process, url) once it answers. With `gate`, the app of
    tests/gated_app.py, whose work named in `holds` waits while the file `gate` exists (`gated_app.HOLDS`)."""
    port = free_port()
    script = [str(ROOT / "app" / "main.py")]
    if gate is not None:
        script = [str(ROOT / "tests" / "gated_app.py"), str(gate), ",".join(holds)]
    # PYTHONPATH: the checkout under test (cait and app), whatever version is installed in the environment
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, *script, "--port", str(port), "--device", "cpu", *args],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}/"
    wait_until_served(proc, url, log)
    return proc, url


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def chromium():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_page(browser, url: str, width: int = 1400):
    """A page in a fresh browser context (its own cookies and session), on the app's URL."""
    page = browser.new_context(viewport={"width": width, "height": 1600}).new_page()
    page.set_default_timeout(TIMEOUT)
    # the page's own errors (e.g. Gradio's "Connection errored out"), shown with a failed test's output
    page.on("console", lambda m: print(f"browser {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.goto(url)
    return page


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app as a user starts it (default model, shipped weights if present)."""
    tmp = tmp_path_factory.mktemp("browser")
    proc, url = start_server([], tmp / "server.log")
    try:
        yield url, tmp
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def page(chromium, server):
    url, tmp = server
    requests: list[str] = []
    page = open_page(chromium, url)
    page.on("request", lambda r: requests.append(r.url))
    page.outside_requests = lambda: [
        u for u in requests if urlparse(u).hostname not in ("127.0.0.1", None) and not u.startswith(("data:", "blob:"))
    ]
    page.tmp = tmp
    yield page
    page.context.close()


def grid_images(page):
    return page.locator(".ca-grid img")  # one gallery per CA layer


def test_example_gives_predictions_and_attention_grid(page):
    heads = cait.get_config(cait.DEFAULT_MODEL).num_heads
    expect(page.locator("#header")).to_contain_text("CaiT")
    page.locator("#examples button.thumbnail-item").first.click()
    expect(grid_images(page)).to_have_count(2 * (heads + 1))  # 2 CA layers x (mean + heads)
    expect(page.locator("#top5")).to_contain_text("%")
    expect(page.locator("#status")).to_contain_text("Top-1")
    labels = set(cait.config.FASHION_MNIST_CLASSES)
    top5_text = page.locator("#top5").inner_text()
    assert sum(label in top5_text for label in labels) >= 5
    page.wait_for_function(
        "() => [...document.querySelectorAll('.ca-grid img')].every(i => i.complete && i.naturalWidth > 100)"
    )
    expect(page.locator("#ca_grid_2")).to_contain_text("CA layer 2")
    expect(page.locator("#ca_grid_2")).to_contain_text("mean · self")
    expect(page.locator("#grid_png")).to_contain_text("class_attention")
    expect(page.locator("#numbers_json")).to_contain_text("cait_analysis")
    page.screenshot(path=SHOTS / "cait_app_class_attention.png", full_page=True)


def test_colormap_switch_and_enlarging_a_head(page):
    before = grid_images(page).first.get_attribute("src")
    page.locator("#cmap input").click()
    page.get_by_role("option", name="viridis").click()
    page.wait_for_function(
        "(old) => { const i = document.querySelector('.ca-grid img'); return i && i.src !== old "
        "&& i.complete && i.naturalWidth > 100; }",
        arg=before,
    )
    grid_images(page).nth(1).click()  # CA1 head 1 (after the CA1 mean): enlarged below the grid
    expect(page.locator("#ca_big .js-plotly-plot")).to_be_visible()
    expect(page.locator("#ca_big")).to_contain_text("CA1 head 1")
    expect(page.locator("#ca_big")).to_contain_text("patch grid")
    # the opacity slider redraws from the keyboard too
    before = grid_images(page).first.get_attribute("src")
    page.locator("#alpha input[type=range]").focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("(old) => document.querySelector('.ca-grid img').src !== old", arg=before)
    page.screenshot(path=SHOTS / "cait_app_viridis.png", full_page=True)


def test_saliency_and_layerscale_render(page):
    page.get_by_role("tab", name="Saliency").click()
    page.locator("#sal_run").click()
    expect(page.locator("#sal_gallery img")).to_have_count(3)  # the three default methods, nothing more
    expect(page.locator("#sal_gallery")).to_contain_text("insertion AUC")
    page.screenshot(path=SHOTS / "cait_app_saliency.png", full_page=True)
    page.get_by_role("tab", name="LayerScale").click()
    expect(page.locator("#ls_plot .js-plotly-plot")).to_be_visible()
    expect(page.locator("#ls_plot .scatterlayer .trace")).not_to_have_count(0)
    expect(page.locator("#ls_plot")).to_contain_text("init eps")
    expect(page.locator("#ratio_plot .js-plotly-plot")).to_be_visible()
    page.screenshot(path=SHOTS / "cait_app_layerscale.png", full_page=True)
    page.get_by_role("tab", name="Model").click()
    expect(page.locator("#model_md")).to_contain_text(cait.DEFAULT_MODEL)
    expect(page.locator("#model_md")).to_contain_text(re.compile("FLOPs"))
    expect(page.locator("#model_md")).not_to_contain_text("in the Model tab")  # it is this tab
    page.get_by_text("Model card (how it was trained").click()
    key = page.locator("#card_md table td").first
    expect(key).to_have_text("architecture")
    assert key.bounding_box()["width"] > 100  # the key column's words whole, not crushed letter by letter


def test_bad_file_shows_a_message(page):
    page.get_by_role("tab", name="Class attention").click()
    page.locator("#image_in button[aria-label='Remove Image']").click()
    expect(grid_images(page)).to_have_count(0)
    bad = page.tmp / "holiday.png"
    bad.write_text("not really a picture\n" * 20)
    upload_and_settle(page, bad)  # the analysis and its follow-up (which skips) have answered
    expect(page.locator("#status")).to_contain_text("Could not analyse this file")
    expect(page.locator("#status")).to_contain_text("not an image")
    assert_no_error_state(page, page.tmp / "server.log")
    page.screenshot(path=SHOTS / "cait_app_bad_file.png", full_page=True)
    # the server keeps serving
    page.locator("#image_in button[aria-label='Remove Image']").click()
    pick_example(page, 1)  # its follow-up too, or it could land during the next test's own analysis


def upload_and_settle(page, path: Path, events: int = 2) -> None:
    """Uploads `path` and waits until its `events` events (the analysis and its follow-up) have answered:
    Gradio streams a page's answers on a queue/data request that ends once none is pending."""
    seen: list[str] = []
    joined = lambda r: seen.append("join") if "queue/join" in r.url else None
    streamed = lambda r: seen.append("done") if "queue/data" in r.url else None  # ended, or closed by the page
    page.on("request", joined)
    page.on("requestfinished", streamed)
    page.on("requestfailed", streamed)
    try:
        page.locator("#image_in input[type=file]").set_input_files(str(path))
        for _ in range(900):
            if seen.count("join") >= events and seen[-1] == "done":
                return
            page.wait_for_timeout(100)  # lets Playwright deliver the request events
        raise AssertionError(f"the upload's events did not answer: {seen}")
    finally:
        page.remove_listener("request", joined)
        page.remove_listener("requestfinished", streamed)
        page.remove_listener("requestfailed", streamed)


def assert_no_error_state(page, log: Path) -> None:
    """No toast, no component in Gradio's error state, no traceback in the server's log."""
    assert "didn't return enough output values" not in page.content()
    assert page.locator(".toast-body, .error").count() == 0, page.locator(".toast-body, .error").all_inner_texts()
    assert "Traceback" not in log.read_text()


def test_truncated_and_empty_uploads_leave_no_error_state(page):
    """Every failed decode is one message in the status line: its follow-up does not run into an error."""
    page.get_by_role("tab", name="Class attention").click()
    pick_example(page, 0)
    scene = sorted((ROOT / "cait" / "examples").glob("scene_*.png"))[0].read_bytes()
    for name, data in (("truncated.png", scene[: len(scene) // 3]), ("empty.jpg", b"")):
        page.locator("#image_in button[aria-label='Remove Image']").click()
        expect(grid_images(page)).to_have_count(0)
        path = page.tmp / name
        path.write_bytes(data)
        upload_and_settle(page, path)
        expect(page.locator("#status")).to_contain_text("Could not analyse this file")
        assert_no_error_state(page, page.tmp / "server.log")
    page.locator("#image_in button[aria-label='Remove Image']").click()
    pick_example(page, 1)


CLASS_MENUS = ("sal_class", "cz_class", "mx_class")  # the Saliency, Causal and Mechanisms tabs' class menus
CHOSEN_EXAMPLE = "#examples .thumbnail-item.selected"


def test_a_failed_upload_empties_the_class_menus_and_the_examples_highlight(page):
    """The class menus of every tab lose the previous image's class with its other results, and the example
    clicked before is no longer highlighted beside the file that failed."""
    page.get_by_role("tab", name="Class attention").click()
    pick_example(page, 0)
    expect(page.locator(CHOSEN_EXAMPLE)).to_have_count(1)
    for tab, menu in zip(("Saliency", "Causal", "Mechanisms"), CLASS_MENUS):
        page.get_by_role("tab", name=tab).click()  # a tab's menu is drawn once the tab is opened
        expect(page.locator(f"#{menu} input")).not_to_have_value("")
    bad = page.tmp / "notes.png"
    bad.write_text("not really a picture\n" * 20)
    upload_and_settle(page, bad, events=3)  # the analysis, its follow-up, the open Mechanisms tab's
    expect(page.locator("#status")).to_contain_text("Could not analyse this file")
    for menu in CLASS_MENUS:
        expect(page.locator(f"#{menu} input")).to_have_value("")
    expect(page.locator(CHOSEN_EXAMPLE)).to_have_count(0)
    page.get_by_role("tab", name="Class attention").click()
    page.locator("#image_in button[aria-label='Remove Image']").click()
    pick_example(page, 1)


def test_a_27_mb_upload_is_refused_calmly_in_the_status_line(page):
    """A file over the limit is one message in the status line, as for any file that fails: no error toast, no
    failed request, and the last image's results go."""
    from app.images import MAX_UPLOAD_MB

    page.get_by_role("tab", name="Class attention").click()
    pick_example(page, 0)
    expect(page.locator(CHOSEN_EXAMPLE)).to_have_count(1)
    errors: list[str] = []
    on_console = lambda m: errors.append(m.text) if m.type == "error" else None
    on_response = lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None
    page.on("console", on_console)
    page.on("response", on_response)
    try:
        big = page.tmp / "photo.png"
        big.write_bytes(b"\x89PNG" + bytes(27 * 2**20 - 4))
        upload_and_settle(page, big)
        expect(page.locator("#status")).to_contain_text(f"27.0 MB, larger than this app's limit of {MAX_UPLOAD_MB} MB")
        expect(grid_images(page)).to_have_count(0)
        expect(page.locator(CHOSEN_EXAMPLE)).to_have_count(0)
        assert_no_error_state(page, page.tmp / "server.log")
        assert errors == []
    finally:
        page.remove_listener("console", on_console)
        page.remove_listener("response", on_response)
    page.locator("#image_in button[aria-label='Remove Image']").click()
    pick_example(page, 1)


def test_a_file_over_what_the_server_takes_is_refused_calmly_too(page):
    """Beyond what the server takes (N49), the page sends a stand-in naming the file's size instead of the file:
    the same message in the status line as for any file over the limit, no error toast, the last image's results
    and the example's highlight gone."""
    from app.images import MAX_RECEIVED_MB, MAX_UPLOAD_MB

    page.get_by_role("tab", name="Class attention").click()
    pick_example(page, 0)
    expect(page.locator(CHOSEN_EXAMPLE)).to_have_count(1)
    huge = page.tmp / "huge.png"
    huge.write_bytes(b"\x89PNG")
    os.truncate(huge, (MAX_RECEIVED_MB + 1) * 2**20)  # sparse: the browser reads its size only
    upload_and_settle(page, huge)
    said = f"{MAX_RECEIVED_MB + 1:.1f} MB, larger than this app's limit of {MAX_UPLOAD_MB} MB"
    expect(page.locator("#status")).to_contain_text(said)
    expect(grid_images(page)).to_have_count(0)
    expect(page.locator(CHOSEN_EXAMPLE)).to_have_count(0)
    assert_no_error_state(page, page.tmp / "server.log")
    page.locator("#image_in button[aria-label='Remove Image']").click()
    pick_example(page, 1)


def test_a_file_that_is_no_image_is_refused_like_a_corrupt_one(page):
    """A PDF (a type the browser does not call an image) reaches the server and is refused in the status line as
    a corrupt image is, not by Gradio's error toast: the last image's results, its picture in the image box and
    the example's highlight go."""
    page.get_by_role("tab", name="Class attention").click()
    pick_example(page, 0)
    expect(page.locator(CHOSEN_EXAMPLE)).to_have_count(1)
    shown = page.locator("#image_in img").get_attribute("src")
    pdf = page.tmp / "paper.pdf"
    pdf.write_bytes(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj << /Type /Catalog >> endobj\ntrailer << >>\n%%EOF\n")
    upload_and_settle(page, pdf)
    expect(page.locator("#status")).to_contain_text("Could not analyse this file")
    expect(page.locator("#status")).to_contain_text("'paper.pdf' is not an image format this app can read")
    expect(grid_images(page)).to_have_count(0)
    expect(page.locator(CHOSEN_EXAMPLE)).to_have_count(0)
    expect(page.locator("#image_in img")).not_to_have_attribute("src", shown)
    assert_no_error_state(page, page.tmp / "server.log")
    page.locator("#image_in button[aria-label='Remove Image']").click()
    pick_example(page, 1)


RADIO_LOOK = """(radio) => {
    const s = getComputedStyle(radio);
    return {checked: radio.checked, fill: s.backgroundColor, border: s.borderColor, dot: s.backgroundImage};
}"""


def test_a_checked_radio_keeps_its_fill_after_the_keyboard_is_used(page):
    """A clicked radio, once the keyboard moves the focus on with the mouse still on it, is drawn as it was."""
    page.get_by_role("tab", name="Class attention").click()
    for label in ("shared per layer", "per tile"):  # the second puts the page back as it was
        radio = page.locator(f"#scale input[value='{label}']")
        page.locator("#scale label", has_text=label).click()
        expect(radio).to_be_checked()
        clicked = radio.evaluate(RADIO_LOOK)
        page.keyboard.press("Tab")  # the focus moves to the next control; the mouse stays on the radio
        expect(radio).not_to_be_focused()
        assert radio.evaluate(RADIO_LOOK) == clicked


def test_the_keyboard_redraws_the_talking_heads_view(page):
    pick_example(page, 0)
    page.get_by_role("tab", name="Talking heads").click()
    changed = "(old) => { const i = document.querySelector('#th_gallery img'); return i && i.src !== old; }"
    before = page.locator("#th_gallery img").first.get_attribute("src")
    page.locator("#th_row input[type=range]").focus()
    page.keyboard.press("ArrowRight")  # an arrow key: one row down
    page.wait_for_function(changed, arg=before)
    before = page.locator("#th_gallery img").first.get_attribute("src")
    number = page.locator("#th_col input[type=number]")
    number.fill("1")
    number.press("Enter")  # a typed value, committed with Enter
    page.wait_for_function(changed, arg=before)
    expect(page.locator("#th_col input[type=range]")).to_have_value("1")
    page.get_by_role("tab", name="Class attention").click()


def test_a_click_on_the_patch_grid_picks_the_query(page):
    pick_example(page, 2)  # with its follow-up, which draws the Talking heads tab
    page.get_by_role("tab", name="Talking heads").click()
    picker = page.locator("#th_pick img")
    expect(picker).to_be_visible()
    before = page.locator("#th_gallery img").first.get_attribute("src")
    box = picker.bounding_box()
    page.mouse.click(box["x"] + box["width"] - 3, box["y"] + 3)  # the top-right patch
    grid = cait.get_config(cait.DEFAULT_MODEL).grid_size
    expect(page.locator("#th_row input[type=number]")).to_have_value("1")
    expect(page.locator("#th_col input[type=number]")).to_have_value(str(grid))
    page.wait_for_function("(old) => document.querySelector('#th_gallery img').src !== old", arg=before)
    expect(page.locator("#th_gallery")).to_contain_text("after proj_w (what the model uses)")
    expect(page.locator("#th_plot .js-plotly-plot")).to_be_visible()
    expect(page.locator("#th_plot")).to_contain_text("proj_l")
    page.get_by_role("tab", name="Class attention").click()


def test_the_causal_tab_ablates_a_clicked_head(page):
    pick_example(page, 3)  # with its follow-up, which leaves the Causal tab until it is opened
    expect(page.locator("#cz_heads_plot .js-plotly-plot")).to_have_count(0)
    page.get_by_role("tab", name="Causal").click()  # computed now
    expect(page.locator("#cz_heads_plot .js-plotly-plot")).to_be_visible()
    expect(page.locator("#cz_knockout")).to_contain_text("CA2")
    expect(page.locator("#cz_top5")).to_contain_text("without CA1 head 1")
    page.locator("#cz_head").get_by_text("CA2 head 3").click()
    expect(page.locator("#cz_top5")).to_contain_text("without CA2 head 3")
    expect(page.locator("#cz_maps")).to_contain_text("CA2 head 3: attention")
    expect(page.locator("#cz_heads_plot")).to_contain_text("CA2 direct write")  # beside the effect of removal
    expect(page.locator("#cz_heads_plot")).to_contain_text("CA2 effect of removal")
    page.locator("#cz_knockout_of").get_by_text("MLP branch").click()  # another part of each block knocked out
    expect(page.locator("#cz_knockout .gtitle")).to_contain_text("gamma_2 is zeroed")
    expect(page.locator("#cz_knockout .legend")).to_contain_text("mean |gamma_2|")  # the line follows the radio
    # with the tab open, a new image's follow-up computes it
    title = page.locator("#cz_heads_plot .gtitle").text_content()
    pick_example(page, 0)
    expect(page.locator("#cz_heads_plot .gtitle")).not_to_have_text(title)
    expect(page.locator("#cz_top5")).to_contain_text("without CA1 head 1")
    page.get_by_role("tab", name="Class attention").click()


def test_the_mechanisms_tab_patches_a_corruption_and_an_example_and_ablates_ticked_heads(page):
    pick_example(page, 2)
    page.get_by_role("tab", name="Mechanisms").click()  # the lens is computed now
    expect(page.locator("#mx_lens .gtitle")).to_contain_text("Logit lens")
    expect(page.locator("#mx_cost")).to_contain_text("forward passes")
    page.locator("#mx_patch_run").click()  # this image under the default corruption
    expect(page.locator("#mx_patch .gtitle")).to_contain_text("gap")
    expect(page.locator("#mx_patch_heads .js-plotly-plot")).to_be_visible()
    first = page.locator("#mx_patch .gtitle").text_content()
    page.locator("#mx_source").get_by_text("an example").click()  # a second image: an example
    expect(page.locator("#mx_corruption")).to_be_hidden()
    page.locator("#mx_example input").click()
    page.get_by_role("option").nth(1).click()
    page.locator("#mx_patch_run").click()
    expect(page.locator("#mx_patch .gtitle")).not_to_have_text(first)
    page.locator("#mx_heads").get_by_text("CA1 head 1").click()
    page.locator("#mx_heads").get_by_text("CA2 head 2").click()
    page.locator("#mx_ablate").click()
    expect(page.locator("#mx_ablation")).to_contain_text("Without CA1 head 1, CA2 head 2")
    page.screenshot(path=str(SHOTS / "cait_app_mechanisms.png"), full_page=True)
    page.get_by_role("tab", name="Class attention").click()


def test_an_enlarged_signed_map_is_centred_on_zero_and_named_for_its_method(page):
    pick_example(page, 1)
    expect(page.locator("#head_stats")).to_contain_text("uniform attention")  # the distance plot's level
    expect(page.locator("#head_stats")).to_contain_text("softmax after proj_l")
    page.get_by_role("tab", name="Saliency").click()
    page.get_by_text("Method options").click()
    # the integrated-gradients steps beside their baseline in the options box; no option's label wraps
    options = page.locator(".accordion, [class*=accordion]").filter(has=page.locator("#ig_baseline")).first
    expect(options.locator("#ig_steps")).to_be_visible()
    heights = [
        page.locator(f"#{c} label, #{c} .label-text, #{c} span[data-testid=block-info]").first.bounding_box()
        for c in ("rollout_discard_ratio", "smoothgrad_stdev", "ig_steps")
    ]
    assert all(h is not None and h["height"] < 60 for h in heights), heights  # at most two lines, not five
    page.locator("#signed input").check()
    page.locator("#sal_score input").uncheck()
    page.locator("#sal_methods").get_by_label("integrated_gradients").check()
    before = json_href(page)
    page.locator("#sal_run").click()
    page.wait_for_function(NEW_JSON, arg=before)  # the run's last step: the maps to enlarge are there
    page.locator("#sal_gallery button.thumbnail-item").nth(2).click()  # class_specific, rollout, then this one
    expect(page.locator("#sal_big")).to_contain_text("integrated_gradients for")
    page.wait_for_function(
        "() => { const d = document.querySelector('#sal_big .js-plotly-plot').data[1]; "
        "return d.zmid === 0 && d.zmin === -d.zmax && d.colorbar.title.text === 'integrated_gradients'; }"
    )
    # the colour scale right under the maps, above the enlarged map
    bar, gallery, big = (page.locator(c).bounding_box() for c in ("#sal_bar", "#sal_gallery", "#sal_big"))
    assert gallery["y"] + gallery["height"] <= bar["y"] + 1 and bar["y"] + bar["height"] <= big["y"] + 1
    page.screenshot(path=SHOTS / "cait_app_signed_map.png", full_page=True)
    page.locator("#sal_score input").check()
    page.get_by_role("tab", name="Class attention").click()


def test_page_makes_no_outside_requests(page):
    assert page.outside_requests() == []


# a JSON download other than `old` (an href, or null for none) is shown: a new analysis' follow-up is done
NEW_JSON = "(old) => { const a = document.querySelector('#numbers_json a'); return a && a.href !== old; }"
JSON_HREF = "() => { const a = document.querySelector('#numbers_json a'); return a ? a.href : null; }"


def json_href(page) -> str | None:
    """The href of the JSON download shown, None if there is none. Read in one step in the page: a count and
    then a read could see the link removed in between (an event clearing the downloads) and wait for it."""
    return page.evaluate(JSON_HREF)


def pick_example(page, index: int = 0) -> None:
    """Clicks example `index` and waits for its analysis and that analysis' follow-up (downloads, other tabs).
    On the module-scoped page an earlier analysis is already shown ("Top-1" in the status, a JSON download),
    so waits for this one's own JSON download: the analysis first empties the download, its follow-up then
    shows a new one (every request writes into a fresh folder, `app.workdir`, so its href is new, even for
    the same example). Waiting for the follow-up also keeps it from landing during the caller's next steps."""
    before = json_href(page)
    page.locator("#examples button.thumbnail-item").nth(index).click()
    page.wait_for_function(NEW_JSON, arg=before)
    expect(page.locator("#status")).to_contain_text("Top-1")


def load_in_model_tab(page, variant: str, checkpoint: str = "") -> None:
    page.get_by_role("tab", name="Model").click()
    page.locator("#variant input").fill(variant)
    page.get_by_role("option", name=variant, exact=True).click()
    page.locator("#checkpoint textarea").fill(checkpoint)
    page.locator("#load_btn").click()


def test_each_page_keeps_its_own_model(chromium, server):
    """A model loaded in one browser session changes that page only; a second page (another context)
    keeps the default model's header, examples, sliders and grid."""
    first, second = open_page(chromium, server[0]), open_page(chromium, server[0])
    try:
        load_in_model_tab(first, "cait_nano_28")
        expect(first.locator("#load_msg")).to_contain_text("Loaded cait_nano_28")
        expect(first.locator("#header")).to_contain_text("cait_nano_28")
        second.reload()
        expect(second.locator("#header")).to_contain_text(cait.DEFAULT_MODEL)
        first.get_by_role("tab", name="Class attention").click()
        pick_example(first)
        pick_example(second)
        heads = {
            page: cait.get_config(name).num_heads
            for page, name in ((first, "cait_nano_28"), (second, cait.DEFAULT_MODEL))
        }
        for page, h in heads.items():
            expect(page.locator(".ca-grid img")).to_have_count(2 * (h + 1))
        expect(first.locator("#examples")).to_contain_text("true:")
        assert "fashion-mnist-" in first.locator("#examples img").first.get_attribute("src")
        assert "scene_" in second.locator("#examples img").first.get_attribute("src")
        for page, name in ((first, "cait_nano_28"), (second, cait.DEFAULT_MODEL)):
            page.get_by_role("tab", name="Talking heads").click()
            grid = cait.get_config(name).grid_size
            expect(page.locator("#th_row input[type=number]")).to_have_attribute("max", str(grid))
            page.get_by_role("tab", name="Model").click()
            expect(page.locator("#model_md")).to_contain_text(name)
    finally:
        first.context.close()
        second.context.close()


def test_a_failed_load_is_one_message_and_the_page_stays_usable(chromium, server):
    page = open_page(chromium, server[0])
    try:
        load_in_model_tab(page, "cait_pico_32", str(server[1]))  # a directory, not a checkpoint
        expect(page.locator("#load_msg")).to_contain_text("is a directory")
        expect(page.locator("#load_msg")).to_contain_text("Could not load the model")
        assert page.locator(".error, .toast-body.error, [data-testid='toast-body']").count() == 0
        expect(page.locator("#header")).to_contain_text(cait.DEFAULT_MODEL)
        page.get_by_role("tab", name="Class attention").click()
        pick_example(page, 2)  # examples still take clicks: nothing covers them
        expect(page.locator(".ca-grid img")).not_to_have_count(0)
    finally:
        page.context.close()


def analyses_logged(server) -> int:
    """How many images the server has analysed (it logs one line per analysis)."""
    return (server[1] / "server.log").read_text().count("INFO cait.app: analysed ")


def test_replacing_an_image_runs_the_analysis_once(chromium, server):
    page = open_page(chromium, server[0])
    try:
        pick_example(page)
        first_json = json_href(page)
        before = analyses_logged(server)
        scene = sorted((ROOT / "cait" / "examples").glob("scene_*.png"))[3]
        page.locator("#image_in input[type=file]").set_input_files(str(scene))  # a new file over the example
        page.wait_for_function(NEW_JSON, arg=first_json)  # its follow-up is done too
        # One more event, and its answer: a second analysis of the upload would have been queued before it.
        tile = page.locator(".ca-grid img").first.get_attribute("src")
        page.locator("#cmap input").click()
        page.get_by_role("option", name="viridis").click()
        page.wait_for_function("(old) => document.querySelector('.ca-grid img').src !== old", arg=tile)
        assert analyses_logged(server) - before == 1
    finally:
        page.context.close()


def tile_pixels(page, index: int) -> bytes:
    """The RGB pixels of class-attention tile `index` as the server sends them."""
    from io import BytesIO

    from PIL import Image

    with urllib.request.urlopen(grid_images(page).nth(index).get_attribute("src"), timeout=30) as r:
        return Image.open(BytesIO(r.read())).convert("RGB").tobytes()


def test_opacity_redraws_from_the_keyboard_without_a_new_analysis(chromium, server):
    page = open_page(chromium, server[0])
    try:
        pick_example(page)
        analyses, json_before = analyses_logged(server), json_href(page)
        changed = (
            "(old) => { const i = document.querySelector('.ca-grid img'); return i && i.src !== old "
            "&& i.complete && i.naturalWidth > 100; }"
        )
        # arrow keys on the slider: one step each
        before = grid_images(page).first.get_attribute("src")
        page.locator("#alpha input[type=range]").focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function(changed, arg=before)
        expect(page.locator("#alpha input[type=number]")).to_have_value("0.55")
        # a typed value, committed with Enter: at opacity 0 every tile is the bare image, so all are alike
        before = grid_images(page).first.get_attribute("src")
        number = page.locator("#alpha input[type=number]")
        number.fill("0")
        number.press("Enter")
        page.wait_for_function(changed, arg=before)
        assert tile_pixels(page, 0) == tile_pixels(page, 1) == tile_pixels(page, 3)
        before = grid_images(page).first.get_attribute("src")
        page.locator("#alpha input[type=range]").focus()
        page.keyboard.press("ArrowRight")  # 0.05: the heat shows again, and differs per head
        page.wait_for_function(changed, arg=before)
        assert tile_pixels(page, 0) != tile_pixels(page, 1)
        # only the overlay was redrawn: no analysis, no follow-up (its JSON download is the same file)
        assert analyses_logged(server) == analyses
        assert json_href(page) == json_before
    finally:
        page.context.close()


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory):
    """The app on a cheap random model with 16 heads (the head count of M24/M36/M48)."""
    tmp = tmp_path_factory.mktemp("wide")
    path = tmp / "sixteen_heads.safetensors"
    cait.save_weights(cait.load_model("cait_pico_32", weights=False, num_heads=16).model, path)
    proc, url = start_server(["--checkpoint", str(path)], tmp / "server.log")
    try:
        yield url
    finally:
        stop_server(proc)


OUTSIDE = """(selector) => [...document.querySelectorAll(selector)].filter(e => {
    const r = e.getBoundingClientRect(); return r.left < 0 || r.right > window.innerWidth; }).length"""
CUT_CAPTIONS = """(selector) => [...document.querySelectorAll(selector)].filter(e => e.scrollWidth > e.clientWidth + 1
    || e.scrollHeight > e.clientHeight + 1).map(e => e.textContent)"""
SCROLLING = """(selector) => [...document.querySelectorAll(selector + ' *')].filter(e =>
    e.scrollHeight > e.clientHeight + 2 && ['auto', 'scroll'].includes(getComputedStyle(e).overflowY)).length"""


# The saliency table's (method, seconds) rows as the page shows them (Gradio's grid cells: the method is the
# first column, the seconds the last)
TABLE_SECONDS = """() => {
    const rows = {};
    for (const cell of document.querySelectorAll('#sal_table [role=gridcell][data-row]'))
        (rows[cell.dataset.row] ??= [])[+cell.dataset.col] = cell.innerText.trim();
    return Object.values(rows).map(cells => [cells[0], parseFloat(cells[cells.length - 1])]);
}"""


def test_sixteen_heads_fit_1280_px_with_readable_captions(chromium, wide_server):
    page = open_page(chromium, wide_server, width=1280)
    try:
        pick_example(page)
        expect(page.locator(".ca-grid img")).to_have_count(2 * 17)
        page.wait_for_function("() => [...document.querySelectorAll('.ca-grid img')].every(i => i.complete)")
        assert page.evaluate(OUTSIDE, ".ca-grid img") == 0
        assert (
            page.evaluate(
                "() => Math.min(...[...document.querySelectorAll('.ca-grid img')].map("
                "i => i.getBoundingClientRect().width))"
            )
            >= 100
        )
        assert page.evaluate(CUT_CAPTIONS, ".ca-grid .caption-label") == []
        expect(page.locator("#ca_grid_1")).to_contain_text("head 16")
        page.screenshot(path=SHOTS / "cait_app_16_heads.png", full_page=True)
        page.get_by_role("tab", name="Talking heads").click()
        expect(page.locator("#th_gallery img")).to_have_count(3 * 16)  # three stages x 16 heads, all shown
        assert page.evaluate(SCROLLING, "#th_gallery") == 0 and page.evaluate(OUTSIDE, "#th_gallery img") == 0
        page.get_by_role("tab", name="Saliency").click()
        boxes = page.locator("#sal_methods input[type=checkbox]")
        for i in range(boxes.count()):
            boxes.nth(i).check()
        page.locator("#sal_run").click()
        expect(page.locator("#sal_gallery img")).to_have_count(len(cait.explain.METHODS))
        expect(page.locator("#sal_table")).to_contain_text("occlusion")
        # each method's own seconds in its row (which row is charged what: tests/test_app_session.py, in process;
        # two rows' seconds compared here, on the page's two decimals under load, tied)
        seconds = dict(page.evaluate(TABLE_SECONDS))
        assert set(seconds) == set(cait.explain.METHODS)
        assert seconds["occlusion"] > 0 and all(v >= 0 for v in seconds.values())
        page.wait_for_function(
            "() => [...document.querySelectorAll('#sal_gallery img, #sal_region img')].every("
            "i => i.complete && i.naturalWidth > 0)"
        )
        assert page.evaluate(SCROLLING, "#sal_gallery") == 0
        page.screenshot(path=SHOTS / "cait_app_16_heads_saliency.png", full_page=True)
    finally:
        page.context.close()


def test_the_follow_up_starts_after_the_tiles_are_fetched(page):
    """The analysis' follow-ups (downloads and other tabs, then the Mechanisms tab's) are requested only once the
    browser has every class-attention tile, so that they do not compete with fetching them."""
    heads = cait.get_config(cait.DEFAULT_MODEL).num_heads
    events = []
    tile = lambda url: "/ca1_" in url or "/ca2_" in url
    page.on("requestfinished", lambda r: events.append("tile") if tile(r.url) else None)
    page.on("request", lambda r: events.append("join") if "queue/join" in r.url else None)
    # an example no other test on this module-scoped page shows, so that its tiles are new to the browser
    page.locator("#examples button.thumbnail-item").nth(4).click()
    for _ in range(300):
        if events.count("join") >= 3 and events.count("tile") >= 2 * (heads + 1):
            break
        page.wait_for_timeout(100)  # lets Playwright deliver the request events
    joins = [i for i, e in enumerate(events) if e == "join"]
    tiles = [i for i, e in enumerate(events) if e == "tile"]
    assert len(joins) == 3 and len(tiles) == 2 * (heads + 1), events  # the analysis, then its two follow-ups
    assert joins[0] < min(tiles) and max(tiles) < joins[1], events


CAPTIONS_OVER_IMAGES = """(selector) => [...document.querySelectorAll(selector + ' .thumbnail-item')].filter(t => {
    const img = t.querySelector('img'), cap = t.querySelector('.caption-label');
    if (!img || !cap) return false;
    const a = img.getBoundingClientRect(), b = cap.getBoundingClientRect();
    return b.top < a.bottom - 1 && b.bottom > a.top + 1 && b.left < a.right - 1 && b.right > a.left + 1;
}).map(t => t.textContent)"""


def test_no_caption_covers_its_tile(chromium, wide_server):
    """16 heads (the talking-heads captions wrap to several lines) and a saliency tile's long caption: every
    caption sits under its image, none over it (bounding boxes)."""
    page = open_page(chromium, wide_server, width=1280)
    try:
        pick_example(page)
        page.wait_for_function("() => [...document.querySelectorAll('.ca-grid img')].every(i => i.complete)")
        assert page.evaluate(CAPTIONS_OVER_IMAGES, ".ca-grid") == []
        assert page.evaluate(CAPTIONS_OVER_IMAGES, "#examples") == []
        page.get_by_role("tab", name="Talking heads").click()
        expect(page.locator("#th_gallery img")).to_have_count(3 * 16)
        assert page.evaluate(CAPTIONS_OVER_IMAGES, "#th_gallery") == []
        page.get_by_role("tab", name="Saliency").click()
        page.locator("#sal_score input").uncheck()  # no scoring: the maps alone, fast
        page.locator("#sal_run").click()
        expect(page.locator("#sal_gallery img")).to_have_count(3)
        assert page.evaluate(CAPTIONS_OVER_IMAGES, "#sal_gallery") == []
        assert "AUC" not in page.locator("#sal_gallery").inner_text()
    finally:
        page.context.close()


def test_an_unknown_model_in_the_address_is_said_on_the_first_tab_and_leaves_the_address(chromium, server):
    page = open_page(chromium, server[0] + "?model=cait_bogus")
    try:
        expect(page.locator("#status")).to_contain_text("unknown model cait_bogus")
        page.wait_for_url(lambda url: "cait_bogus" not in url)
    finally:
        page.context.close()


def test_a_reload_keeps_the_pages_model(chromium, server):
    page = open_page(chromium, server[0])
    try:
        load_in_model_tab(page, "cait_nano_28")
        expect(page.locator("#load_msg")).to_contain_text("Loaded cait_nano_28")
        page.wait_for_url(re.compile(r"[?&]model=cait_nano_28"))
        page.reload()
        expect(page.locator("#header")).to_contain_text("cait_nano_28")
        page.get_by_role("tab", name="Model").click()
        expect(page.locator("#model_md")).to_contain_text("cait_nano_28")
        expect(page.locator("#variant input")).to_have_value("cait_nano_28")
    finally:
        page.context.close()


def test_two_starts_choose_the_same_precision(chromium, server, tmp_path):
    """--precision auto decides once per machine and software (cait.runtime keeps the measurement), and the
    log and the Model tab say which precision and why; the header says how it was decided."""
    first = (server[1] / "server.log").read_text()
    proc, url = start_server([], tmp_path / "second.log")
    try:
        second = (tmp_path / "second.log").read_text()
        chosen = [re.search(r"forward-only passes in (\w+), ([^:]+): (.*)", log) for log in (first, second)]
        assert all(chosen) and chosen[0].group(1) == chosen[1].group(1)
        page = open_page(chromium, url)
        try:
            page.get_by_role("tab", name="Model").click()
            expect(page.locator("#model_md")).to_contain_text("--precision auto")
            expect(page.locator("#header")).to_contain_text("bf16" if chosen[1].group(1) == "bf16" else "fp32")
            expect(page.locator("#header")).to_contain_text(chosen[1].group(2))  # e.g. "remembered from DATE"
        finally:
            page.context.close()
    finally:
        stop_server(proc)
