"""The Mechanisms tab in a real browser (the fixtures of test_app_browser): patching on a page whose model is not
the server's default (N34), a second "image" that is no image (N35), the default corruption's gap and what the
plots say when a gap is too small for shares (N38), token patching's map with its cost said before, its progress
and its Stop, Stop buttons that are enabled only while their run runs (N51), and the tab's layout (N47).
Screenshots go to the temp directory as cait_app_mechanisms_*.png."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from test_app_browser import (  # noqa: F401 (chromium: a fixture)
    SHOTS,
    chromium,
    open_page,
    pick_example,
    start_server,
    stop_server,
)

import cait

PLOT_TRACES = "(id) => document.querySelector(`#${id} .js-plotly-plot`).data.map(t => t.name)"
PLOT_TEXT = "(id) => JSON.stringify(document.querySelector(`#${id} .js-plotly-plot`).data[0].text)"
# the elements inside `id` whose content is cut off (taller or wider than the box that hides the rest)
CLIPPED = """(id) => [...document.getElementById(id).querySelectorAll("*")]
  .filter((e) => ["hidden", "clip"].includes(getComputedStyle(e).overflowY) && e.clientHeight > 0
    && (e.scrollHeight > e.clientHeight + 1 || e.scrollWidth > e.clientWidth + 1))
  .map((e) => e.className)"""
PLOT_NOTES = "(id) => document.querySelector(`#${id} .js-plotly-plot`).layout.annotations.map(a => a.text)"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(url, folder of its log, gate): the app as a user starts it (the shipped default model), with --random-init:
    a page may ask for a paper variant without weights. A test holds its long runs "still running" by closing the
    gate (creating the file: tests/gated_app.py); it is open otherwise."""
    tmp = tmp_path_factory.mktemp("mechanisms_browser")
    proc, url = start_server(["--random-init"], tmp / "server.log", gate=tmp / "gate")
    try:
        yield url, tmp, tmp / "gate"
    finally:
        (tmp / "gate").unlink(missing_ok=True)
        stop_server(proc)


def tracebacks(server) -> int:
    return (server[1] / "server.log").read_text().count("Traceback")


def mechanisms_page(chromium, server, model: str | None = None):  # noqa: F811
    """A fresh page (on `model` by its address), an example analysed, the Mechanisms tab open with its lens."""
    page = open_page(chromium, server[0] + (f"?model={model}" if model else ""))
    expect(page.locator("#header")).to_contain_text(model or cait.DEFAULT_MODEL)
    pick_example(page, 0)
    page.get_by_role("tab", name="Mechanisms").click()
    expect(page.locator("#mx_lens .gtitle")).to_contain_text("Logit lens")
    return page


def assert_calm(page) -> None:
    """No toast and no component in Gradio's error state."""
    errors = page.locator(".toast-body, .error")
    assert errors.count() == 0, errors.all_inner_texts()


def gap_of(page) -> float:
    title = page.locator("#mx_patch .gtitle").text_content()
    return float(re.search(r"gap (-?[0-9.]+)", title).group(1))


def test_patch_and_token_map_on_a_page_whose_model_is_not_the_servers_default(chromium, server):  # noqa: F811
    """N34: a page on cait_nano_28 (the server's default is micro_136) patches and maps; before, the example menu
    kept the default model's value, which the new choices lacked, and every Patch was an error toast."""
    before = tracebacks(server)
    page = mechanisms_page(chromium, server, "cait_nano_28")
    try:
        page.locator("#mx_patch_run").click()
        expect(page.locator("#mx_patch .gtitle")).to_contain_text("gap")
        expect(page.locator("#mx_patch_heads .js-plotly-plot")).to_be_visible()
        page.locator("#mx_source").get_by_text("an example").click()  # an example of this page's model
        page.locator("#mx_example input").click()
        page.get_by_role("option").nth(2).click()
        page.locator("#mx_token_run").click()
        expect(page.locator("#mx_tokens .gtitle")).to_contain_text("rank correlation")
        assert_calm(page)
        assert tracebacks(server) == before
    finally:
        page.context.close()


def test_a_second_file_that_is_no_image_is_one_message_and_clears_the_last_run(chromium, server, tmp_path):  # noqa: F811
    """N35: a text file as the second image: a calm line naming the problem, no traceback in the log, and the
    last run's bars, grid and map are gone from the page."""
    page = mechanisms_page(chromium, server)
    try:
        page.locator("#mx_patch_run").click()
        expect(page.locator("#mx_patch .gtitle")).to_contain_text("gap")
        page.locator("#mx_token_run").click()
        expect(page.locator("#mx_tokens .gtitle")).to_contain_text("rank correlation")
        before = tracebacks(server)
        page.locator("#mx_source").get_by_text("an upload").click()
        bad = tmp_path / "notes.png"
        bad.write_text("not really a picture\n" * 20)
        page.locator("#mx_upload input[type=file]").set_input_files(str(bad))
        # the file row shows the name as its stem and its extension with a space between: "notes .png"
        expect(page.locator("#mx_upload")).to_contain_text(re.compile(r"notes\s*\.png"))
        page.locator("#mx_patch_run").click()
        expect(page.locator("#mx_msg")).to_contain_text("Cannot patch")
        expect(page.locator("#mx_msg")).to_contain_text("not an image")
        expect(page.locator("#mx_patch .js-plotly-plot")).to_have_count(0)
        expect(page.locator("#mx_patch_heads .js-plotly-plot")).to_have_count(0)
        page.locator("#mx_token_run").click()
        expect(page.locator("#mx_tokens .js-plotly-plot")).to_have_count(0)
        expect(page.locator("#mx_msg")).to_contain_text("Cannot patch")
        page.screenshot(path=SHOTS / "cait_app_mechanisms_bad_second_file.png", full_page=True)
        assert_calm(page)
        assert tracebacks(server) == before
    finally:
        page.context.close()


def test_the_default_corruption_leaves_a_real_gap_and_a_small_gap_gives_no_shares(chromium, server):  # noqa: F811
    """N38: the default corruption leaves a gap of at least one logit on the shipped model's first example, so
    the bars carry shares of it; no bar is one that restores the gap by construction (the whole stream is a line,
    labelled as such). A corruption that leaves a small gap gives Δlogits, and the page says why."""
    page = mechanisms_page(chromium, server)
    try:
        page.locator("#mx_patch_run").click()
        expect(page.locator("#mx_patch .gtitle")).to_contain_text("gap")
        assert gap_of(page) >= 1.0
        names = page.evaluate(PLOT_TRACES, "mx_patch")
        assert names == ["attention patched", "MLP patched", "class token patched"]
        assert any("by construction" in note for note in page.evaluate(PLOT_NOTES, "mx_patch"))
        assert "%" in page.evaluate(PLOT_TEXT, "mx_patch_heads")  # shares in the heads' grid
        expect(page.locator("#mx_msg")).not_to_contain_text("No shares")
        first = page.locator("#mx_patch .gtitle").text_content()
        page.locator("#mx_corruption input").click()
        page.get_by_role("option", name="pixelate").click()
        page.locator("#mx_severity input[type=number]").fill("2")
        page.locator("#mx_severity input[type=number]").press("Enter")
        page.locator("#mx_patch_run").click()
        expect(page.locator("#mx_patch .gtitle")).not_to_have_text(first)
        assert abs(gap_of(page)) < 1.0
        expect(page.locator("#mx_msg")).to_contain_text("too small for shares")
        assert "%" not in page.evaluate(PLOT_TEXT, "mx_patch_heads")  # Δlogits, not shares
        page.screenshot(path=SHOTS / "cait_app_mechanisms_small_gap.png", full_page=True)
        assert_calm(page)
    finally:
        page.context.close()


def test_the_token_map_says_its_cost_first_and_the_stops_are_enabled_only_while_running(chromium, server):  # noqa: F811
    """The token map beside the class attention, its region size settable and its cost said before; the Stops
    (N51) are disabled before and after each run."""
    page = mechanisms_page(chromium, server)
    try:
        for stop in ("#mx_patch_stop", "#mx_token_stop"):
            expect(page.locator(stop)).to_be_disabled()
        cost = page.locator("#mx_token_cost")
        expect(cost).to_contain_text(re.compile(r"289 regions, both directions\) takes at least [0-9.]+ forward"))
        page.locator("#mx_region input[type=number]").fill("3")
        page.locator("#mx_region input[type=number]").press("Enter")
        expect(cost).to_contain_text("36 regions")  # 17 x 17 patches in regions of 3: 6 x 6
        page.locator("#mx_token_run").click()
        title = page.locator("#mx_tokens .gtitle")
        expect(title).to_contain_text("regions of 3x3 patches")
        expect(title).to_contain_text(re.compile(r"rank correlation over all regions [+-][0-9.]+ \(restored\)"))
        held = re.compile(r"the top 4 of 36 regions by attention holds [0-9]+% of the restoration")  # 59.19
        expect(title).to_contain_text(held)
        assert page.evaluate(PLOT_NOTES, "mx_tokens")[0].startswith("class attention")
        for stop in ("#mx_patch_stop", "#mx_token_stop"):
            expect(page.locator(stop)).to_be_disabled()
        page.screenshot(path=SHOTS / "cait_app_mechanisms_tokens.png", full_page=True)
        assert_calm(page)
    finally:
        page.context.close()


def test_long_runs_show_progress_and_stop(chromium, server):  # noqa: F811
    """Both long runs, held running by the gate, show their progress and end at a Stop, which frees the model: the
    next run computes."""
    page, gate = mechanisms_page(chromium, server), server[2]
    gate.touch()
    try:
        for run, stop, plot, what in (
            ("#mx_token_run", "#mx_token_stop", "#mx_tokens", "token patching"),
            ("#mx_patch_run", "#mx_patch_stop", "#mx_patch", "patching"),
        ):
            page.locator(run).click()
            expect(page.locator(plot)).to_contain_text(re.compile(r"[0-9]+/[0-9.k]+ runs .*" + what))  # progress
            page.locator(stop).click()
            expect(page.locator("#mx_msg")).to_contain_text("Stopped")
            expect(page.locator(stop)).to_be_disabled()
        gate.unlink()
        grid = cait.get_config(cait.DEFAULT_MODEL).grid_size
        page.locator("#mx_region input[type=number]").fill(str(grid))  # one region: a short run
        page.locator("#mx_region input[type=number]").press("Enter")
        page.locator("#mx_token_run").click()
        expect(page.locator("#mx_tokens .gtitle")).to_contain_text(f"regions of {grid}x{grid} patches")
        assert_calm(page)
    finally:
        gate.unlink(missing_ok=True)
        page.context.close()


def test_the_second_run_controls_fit_their_row(chromium, server):  # noqa: F811
    """N47: the corrupted run's source radio and its upload box: the choices whole on one line, the file box
    wide and tall enough for its words."""
    page = mechanisms_page(chromium, server)
    try:
        page.locator("#mx_source").get_by_text("an upload").click()
        expect(page.locator("#mx_upload")).to_be_visible()
        labels = page.locator("#mx_source label").all()
        for label in labels:
            clipped = label.evaluate("(e) => e.scrollWidth > e.clientWidth + 1 || e.getClientRects().length > 1")
            assert not clipped, label.inner_text()
        assert len({round(label.bounding_box()["y"]) for label in labels}) == 1  # one row of choices
        page.wait_for_timeout(1000)  # the hidden controls' space given back, the layout settled
        assert page.locator("#mx_upload").bounding_box()["width"] >= 300
        page.screenshot(path=SHOTS / "cait_app_mechanisms_upload.png", full_page=True)
        words = page.locator("#mx_upload").inner_text()
        assert "Drop File Here" in words and "Click to Upload" in words, words
        assert page.evaluate(CLIPPED, "mx_upload") == []
    finally:
        page.context.close()
