"""The Compare tab in a real browser (Debian's headless Chromium through Playwright), the shipped 28-px model
against the 136-px one: both models side by side on the page's image, a compare run built in the tab whose Stop
ends it (the build held in the browser until the test lets it go, never raced), built again to the end, its figures
shown and a disagreement image opened as the page's image. One server for the module."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from test_app_browser import NEW_JSON, chromium, json_href, open_page, pick_example, start_server, stop_server  # noqa: F401
from test_dataset_browser import held_build

A, B = "cait_nano_28", "cait_micro_136"
SCENES = 40


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    """The app as a user starts it, on the 28-px model."""
    proc, url = start_server(["--model", A], tmp_path_factory.mktemp("compare") / "server.log")
    try:
        yield url
    finally:
        stop_server(proc)


def test_two_models_side_by_side_a_stopped_run_and_its_disagreements(chromium, url):  # noqa: F811
    page = open_page(chromium, url)
    try:
        pick_example(page)
        page.get_by_role("tab", name="Compare").click()
        page.locator("#cmp_variant input").fill(B)
        page.get_by_role("option", name=B, exact=True).click()
        page.locator("#cmp_load").click()
        expect(page.locator("#cmp_top5")).to_contain_text(f"B: {B}")
        expect(page.locator("#cmp_top5")).to_contain_text(f"A: {A}")
        expect(page.locator("#cmp_heads img")).to_have_count(3 * 2 * 3)  # 2 CA layers x 3 shared heads x (A, B, -)
        expect(page.locator("#cmp_dla .js-plotly-plot")).to_have_count(1)
        expect(page.locator("#cmp_depth .js-plotly-plot")).to_have_count(1)
        # a run asked for and held in the browser before it reaches the queue (the gate the test opens): a Stop
        # pressed meanwhile ends it when it starts
        page.locator("#cmp_scenes input").fill(str(SCENES))
        held = held_build(page, SCENES)
        page.locator("#cmp_build").click()
        expect(page.locator("#cmp_stop")).to_be_enabled()
        for _ in range(300):
            if held:
                break
            page.wait_for_timeout(100)
        assert held, "the build never asked the queue"
        with page.expect_response(lambda r: r.url.endswith("/run/predict")):  # the Stop, off the queue
            page.locator("#cmp_stop").click()
        held[0].continue_()
        page.unroute("**/queue/join*")
        expect(page.locator("#cmp_run_msg")).to_contain_text("Stopped")
        expect(page.locator("#cmp_stop")).to_be_disabled()
        # built again: it continues to the end and opens
        page.locator("#cmp_build").click()
        expect(page.locator("#cmp_run_msg")).to_contain_text("images answered differently")
        expect(page.locator("#cmp_cka .js-plotly-plot")).to_have_count(1)
        expect(page.locator("#cmp_matrix .js-plotly-plot")).to_have_count(1)
        expect(page.locator("#cmp_msg")).to_contain_text("paired by the open run's matching")
        tiles = page.locator("#cmp_disagree button.thumbnail-item")
        expect(tiles.first).to_be_visible()
        before = json_href(page)
        tiles.first.click()  # opens as the page's image (its first view and follow-up); the Compare tab compares it
        page.wait_for_function(NEW_JSON, arg=before)
        expect(page.locator("#image_in img")).to_have_attribute("src", re.compile("disagreement_0"))
        expect(page.locator("#cmp_top5")).to_contain_text(f"B: {B}")
        expect(page.locator("#cmp_heads img")).to_have_count(3 * 2 * 3)
    finally:
        page.context.close()
