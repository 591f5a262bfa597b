"""The Compare tab in a real browser (Debian's headless Chromium through Playwright), the shipped 28-px model
against the 136-px one: both models side by side on the page's image, a compare run built in the tab whose Stop
ends it (the build held on the server partway, at a gate the test opens: never raced) keeping the shard it wrote,
built again to the end, its figures shown and a disagreement image opened as the page's image. One server for the
module (`gated_app.py`: the app with the gate)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from gated_app import reached
from playwright.sync_api import expect
from test_app_browser import (  # noqa: F401 (chromium: the fixture)
    NEW_JSON,
    chromium,
    json_href,
    open_page,
    pick_example,
    start_server,
    stop_server,
)

A, B = "cait_nano_28", "cait_micro_136"
SCENES = 40


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """The app as a user starts it, on the 28-px model, with the compare build held at the gate while the file
    `gate` exists (tests/gated_app.py): (url, gate)."""
    folder = tmp_path_factory.mktemp("compare")
    gate = folder / "gate"
    proc, url = start_server(["--model", A], folder / "server.log", gate=gate, holds=("compare",))
    try:
        yield url, gate
    finally:
        gate.unlink(missing_ok=True)
        stop_server(proc)


def wait_for(path: Path, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"the build never reached its gate ({path.name})"
        time.sleep(0.1)


def test_two_models_side_by_side_a_stopped_run_and_its_disagreements(chromium, gated):  # noqa: F811
    url, gate = gated
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
        # a run built and held partway at the server's gate (two batches done, one shard of 32 scenes written):
        # the Stop pressed meanwhile is answered at once, and the build stops there, keeping that shard
        page.locator("#cmp_scenes input").fill(str(SCENES))
        gate.touch()
        page.locator("#cmp_build").click()
        expect(page.locator("#cmp_stop")).to_be_enabled()
        wait_for(reached(gate))
        with page.expect_response(lambda r: r.url.endswith("/run/predict")) as answer:  # the Stop, off the queue
            page.locator("#cmp_stop").click()
        assert answer.value.ok
        gate.unlink()
        expect(page.locator("#cmp_run_msg")).to_contain_text(f"Stopped with 32 of {SCENES} scenes done")
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
