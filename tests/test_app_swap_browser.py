"""A model swap (`?model=`) and a new image racing in a real browser: an example clicked before the swap landed,
its request reaching the server first. Gradio's queue decides that order on a busy server; here the swap's
request is held and let go (Playwright's routing), so the race is run every time rather than by chance."""

from __future__ import annotations

import json
import urllib.request

from playwright.sync_api import expect
from test_app_browser import assert_no_error_state, chromium, open_page, pick_example, server  # noqa: F401

import cait


def _dependencies(url: str) -> tuple[dict[int, str], list[dict]]:
    """The page's components (id -> elem_id) and events, as Gradio serves them (/config)."""
    with urllib.request.urlopen(url + "config", timeout=30) as r:
        config = json.loads(r.read())
    return {c["id"]: c.get("props", {}).get("elem_id") for c in config["components"]}, config["dependencies"]


def _events(url: str, *, trigger: str, reads: str | None = None, writes: str) -> set[int]:
    """The events of the page triggered by `trigger` (an event name) that read the component `reads` (an elem_id)
    and write `writes`: their fn_index in the queue's join requests."""
    names, dependencies = _dependencies(url)
    return {
        d["id"]
        for d in dependencies
        if any(t[1] == trigger for t in d["targets"])
        and (reads is None or reads in [names.get(i) for i in d["inputs"]])
        and writes in [names.get(i) for i in d["outputs"]]
    }


def test_an_example_clicked_before_a_model_swap_landed_is_analysed_by_the_new_model(chromium, server):  # noqa: F811
    """Item 59.11: the example's click reaches the server before the page's ?model= swap (the swap's request held
    in the browser until the server says the click waits for it): the image is analysed by the swapped model,
    its tiles and talking heads are that model's, within its bounds, and nothing fails."""
    url, tmp = server
    swapped, log = cait.get_config("cait_nano_28"), tmp / "server.log"
    (swap,) = _events(url, trigger="load", writes="header")  # ?model=: the Model tab's `from_address`
    held: dict[str, object] = {}

    def hold(route) -> None:  # the swap's request waits here until let go
        if json.loads(route.request.post_data or "{}").get("fn_index") == swap and "swap" not in held:
            held["swap"] = route
        else:
            route.continue_()

    page = open_page(chromium, "about:blank")
    try:
        page.route("**/queue/join*", hold)
        page.goto(url + "?model=cait_nano_28")
        page.wait_for_function("() => document.querySelector('#examples button.thumbnail-item')")
        for _ in range(600):  # the swap is on its way (the page sends it once mounted)
            if "swap" in held:
                break
            page.wait_for_timeout(100)
        assert "swap" in held
        waits = log.read_text().count("waits for it")
        page.locator("#examples button.thumbnail-item").first.click()
        for _ in range(600):  # the server has the click, and holds it for the swap
            if log.read_text().count("waits for it") > waits:
                break
            page.wait_for_timeout(100)  # lets Playwright deliver the routed requests
        held["swap"].continue_()
        expect(page.locator("#header")).to_contain_text("cait_nano_28")
        expect(page.locator(".ca-grid").first.locator("img")).to_have_count(swapped.num_heads + 1)
        page.get_by_role("tab", name="Talking heads").click()
        expect(page.locator("#th_gallery img")).to_have_count(3 * swapped.num_heads)
        expect(page.locator("#th_row input[type=number]")).to_have_attribute("max", str(swapped.grid_size))
        assert_no_error_state(page, log)
    finally:
        page.context.close()
