"""A model swap (`?model=`) and a new image racing in a real browser: the page's follow-up of an example, sent
with the talking-heads query of the server's default model (row 9 of its 17 x 17 patch grid) before the swap's
new bounds (7 x 7) reached the page, then answered after the swap. Gradio's queue decides that order on a busy
server; here the browser's requests are held and let go in it (Playwright's routing), so the race is run every
time rather than by chance."""

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


def test_a_talking_heads_query_sent_before_a_model_swap_landed_is_taken_for_the_new_model(chromium, server):  # noqa: F811
    url, tmp = server
    default, swapped = cait.get_config(cait.DEFAULT_MODEL), cait.get_config("cait_nano_28")
    row = default.grid_size // 2 + 1  # the query patch a page of the default model starts with
    assert row > swapped.grid_size  # out of the swapped model's bounds: what Gradio refused
    (swap,) = _events(url, trigger="load", writes="header")  # ?model=: the Model tab's `from_address`
    # `ImageEvents.details`, after an upload, an example or an exemplar
    follow_ups = _events(url, trigger="success", reads="th_row", writes="numbers_json")
    held: dict[str, object] = {}

    def hold(route) -> None:  # the swap's and the follow-up's first requests wait here until let go
        fn = json.loads(route.request.post_data or "{}").get("fn_index")
        what = "swap" if fn == swap else "follow-up" if fn in follow_ups else None
        if what and what not in held:
            held[what] = route
        else:
            route.continue_()

    page = open_page(chromium, "about:blank")
    try:
        page.route("**/queue/join*", hold)
        page.goto(url + "?model=cait_nano_28")
        page.wait_for_function("() => document.querySelector('#examples button.thumbnail-item')")
        page.get_by_role("tab", name="Talking heads").click()
        expect(page.locator("#th_row input[type=number]")).to_have_value(str(row))
        assert "swap" in held  # the swap is on its way
        page.locator("#examples button.thumbnail-item").first.click()
        for _ in range(600):
            if "follow-up" in held:
                break
            page.wait_for_timeout(100)  # lets Playwright deliver the routed requests
        sent = json.loads(held["follow-up"].request.post_data)["data"]
        assert sent.count(row) >= 2  # the query's row and column, of the default model
        held["swap"].continue_()  # the swap lands: the page's model and the query's bounds are nano's
        expect(page.locator("#header")).to_contain_text("cait_nano_28")
        expect(page.locator("#th_row input[type=number]")).to_have_attribute("max", str(swapped.grid_size))
        answered = []
        page.on("requestfinished", lambda r: answered.append(r.url) if "queue/data" in r.url else None)
        held["follow-up"].continue_()  # the follow-up, sent before, reaches the server after the swap
        for _ in range(600):
            if answered:
                break
            page.wait_for_timeout(100)
        page.wait_for_timeout(1000)  # an error toast would show by now
        assert_no_error_state(page, tmp / "server.log")
        # the page goes on with the new model: an example's talking heads within its bounds
        pick_example(page, 1)
        expect(page.locator("#th_gallery img")).to_have_count(3 * swapped.num_heads)
        value = int(page.locator("#th_row input[type=number]").input_value())
        assert 1 <= value <= swapped.grid_size
        assert_no_error_state(page, tmp / "server.log")
    finally:
        page.context.close()
