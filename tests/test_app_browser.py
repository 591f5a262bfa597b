"""The app in a real browser (Debian's headless Chromium through Playwright): pick an example, see the
predictions, the attention grid, the saliency maps and the LayerScale plot, switch the colormap, upload
a bad file and see the message; the page makes no request outside this machine.
Screenshots go to /tmp/cait_app_*.png."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest
from playwright.sync_api import expect, sync_playwright

import cait
from test_app import ROOT, free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
TIMEOUT = 90_000  # ms; generous because the test machine is shared
expect.set_options(timeout=TIMEOUT)


def start_server(args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """`python app/main.py ARGS` on a free port; returns (process, url) once it answers."""
    port = free_port()
    # PYTHONPATH: the checkout under test (cait and app), whatever version is installed in the environment
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "app" / "main.py"), "--port", str(port), "--device", "cpu",
                             *args], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"app did not answer within 300 s:\n{log.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """One browser page on the app as a user starts it (default model, shipped weights if present)."""
    tmp = tmp_path_factory.mktemp("browser")
    proc, url = start_server([], tmp / "server.log")
    requests: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.set_default_timeout(TIMEOUT)
            page.on("request", lambda r: requests.append(r.url))
            page.goto(url)
            page.outside_requests = lambda: [u for u in requests if urlparse(u).hostname not in ("127.0.0.1", None)
                                             and not u.startswith(("data:", "blob:"))]
            page.tmp = tmp
            yield page
            browser.close()
    finally:
        stop_server(proc)


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
    page.wait_for_function("() => [...document.querySelectorAll('.ca-grid img')].every(i => i.complete && i.naturalWidth > 100)")
    expect(page.locator("#ca_grid_2")).to_contain_text("CA2 mean")
    expect(page.locator("#grid_png")).to_contain_text("class_attention")
    expect(page.locator("#numbers_json")).to_contain_text("cait_analysis")
    page.screenshot(path="/tmp/cait_app_class_attention.png", full_page=True)


def test_colormap_switch_and_enlarging_a_head(page):
    before = grid_images(page).first.get_attribute("src")
    page.locator("#cmap input").click()
    page.get_by_role("option", name="viridis").click()
    page.wait_for_function("(old) => { const i = document.querySelector('.ca-grid img'); return i && i.src !== old "
                           "&& i.complete && i.naturalWidth > 100; }", arg=before)
    grid_images(page).nth(1).click()  # CA1 head 1 (after the CA1 mean): enlarged below the grid
    page.wait_for_function("() => { const i = document.querySelector('#ca_big img'); return i && i.complete "
                           "&& i.naturalWidth >= 448; }")
    expect(page.locator("#ca_big")).to_contain_text("CA1 head 1")
    page.screenshot(path="/tmp/cait_app_viridis.png", full_page=True)


def test_saliency_and_layerscale_render(page):
    page.get_by_role("tab", name="Saliency").click()
    page.locator("#sal_run").click()
    expect(page.locator("#sal_gallery img")).to_have_count(3)  # the three default methods, nothing more
    expect(page.locator("#sal_gallery")).to_contain_text("insertion AUC")
    page.screenshot(path="/tmp/cait_app_saliency.png", full_page=True)
    page.get_by_role("tab", name="LayerScale").click()
    expect(page.locator("#ls_plot .js-plotly-plot")).to_be_visible()
    expect(page.locator("#ls_plot .scatterlayer .trace")).not_to_have_count(0)
    expect(page.locator("#ls_plot")).to_contain_text("init eps")
    expect(page.locator("#ratio_plot .js-plotly-plot")).to_be_visible()
    page.screenshot(path="/tmp/cait_app_layerscale.png", full_page=True)
    page.get_by_role("tab", name="Model").click()
    expect(page.locator("#model_md")).to_contain_text(cait.DEFAULT_MODEL)
    expect(page.locator("#model_md")).to_contain_text(re.compile("FLOPs"))


def test_bad_file_shows_a_message(page):
    page.get_by_role("tab", name="Class attention").click()
    page.locator("#image_in button[aria-label='Remove Image']").click()
    expect(grid_images(page)).to_have_count(0)
    bad = page.tmp / "holiday.png"
    bad.write_text("not really a picture\n" * 20)
    page.locator("#image_in input[type=file]").set_input_files(str(bad))
    expect(page.locator("#status")).to_contain_text("Could not analyse this file")
    expect(page.locator("#status")).to_contain_text("not an image")
    page.screenshot(path="/tmp/cait_app_bad_file.png", full_page=True)
    # the server keeps serving
    page.locator("#image_in button[aria-label='Remove Image']").click()
    page.locator("#examples button.thumbnail-item").nth(1).click()
    expect(page.locator("#status")).to_contain_text("Top-1")


def test_page_makes_no_outside_requests(page):
    assert page.outside_requests() == []
