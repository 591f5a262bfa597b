"""The Dataset tab's exemplars and the page's examples in a real browser (the atlas server of
test_dataset_browser): one selection frame on the page, on the image shown."""

from __future__ import annotations

from playwright.sync_api import expect
from test_app_browser import chromium, open_page  # noqa: F401 (a fixture)
from test_dataset_browser import atlas_server  # noqa: F401 (a fixture)

FRAMED_EXEMPLAR, FRAMED_EXAMPLE = "#ds_exemplars .thumbnail-item.selected", "#examples .thumbnail-item.selected"


def test_an_example_clicked_after_an_exemplar_unframes_the_exemplar(chromium, atlas_server):  # noqa: F811
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
