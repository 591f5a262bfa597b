"""The page's one list of tabs (`app.ui.TABS`): a tab added there, and nowhere else, takes part in every step of a
new image and a new model, and its events are wired. Components only: no server."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import pytest
import torch

from app import session, ui
from app.loading import load_page_model
from app.models import ModelCache, ModelChoice
from app.page_tab import PageTab
from app.shared import Look
from app.tabs.dataset import AtlasPlaces

SCENE = sorted((Path(__file__).parents[1] / "cait" / "examples").glob("scene_*.png"))[0]
LOOK = Look("inferno", 0.5, "per tile", "smooth", 1.0)


@dataclass
class ToyParts:
    toy_box: gr.Textbox

    @property
    def results(self) -> list:
        return [self.toy_box]


class ToyTab(PageTab):
    """Writes which step it took part in; records its wiring."""

    wired: list = []

    def __init__(self, parts: ToyParts, shared, cache):
        self.parts = parts

    def at_first_view(self, loaded, a) -> dict:
        return {self.parts.toy_box: "first view"}

    def for_model(self, loaded) -> dict:
        return {self.parts.toy_box: f"model {loaded.name}"}

    def detailed(self) -> list:
        return [self.parts.toy_box]

    def details(self, loaded, a, ask) -> dict:
        return {self.parts.toy_box: f"details of class {a.top_class} at layer {ask.th_layer}"}

    def followed(self) -> list:
        return [self.parts.toy_box]

    def follow_up(self, choice, a, request, progress) -> dict:
        return {self.parts.toy_box: "followed up"}

    def wire(self, demo, page) -> None:
        self.wired.append(page)


def toy_build(first, tab) -> ToyParts:
    return ToyParts(toy_box=gr.Textbox(elem_id="toy_box"))


@pytest.fixture(scope="module")
def toy_page():
    cache = ModelCache(load_page_model, max_bytes=2**30, device=torch.device("cpu"))
    choice = ModelChoice("cait_pico_32", random_init=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ui, "TABS", (*ui.TABS, ("Toy", "toy", toy_build, ToyTab)))
        demo, page, tabs = ui.compose(cache.get(choice), cache, AtlasPlaces.of(None, None))
        ui.wire(demo, page, tabs, cache=cache, default=choice)
        yield demo, page, tabs, cache.get(choice)


def test_a_tab_added_to_the_list_takes_part_in_every_step_of_a_new_image(toy_page):
    demo, page, tabs, loaded = toy_page
    box, shown = page.toy.toy_box, tuple(page.ca.ca_props.value)
    assert isinstance(tabs.toy, ToyTab) and ToyTab.wired == [page]
    assert box in tabs.image.results() and box in page.everything()
    assert tabs.image.cleared(shown)[box] is None  # a removed image empties it
    a = session.analyse(loaded, str(SCENE))
    assert tabs.image.first_view(loaded, a, LOOK, shown, uploaded=False)[box] == "first view"
    asked = dict(choice=loaded.choice, analysis=a, **vars(LOOK), th_layer=2, th_row=1, th_col=1, region_of=None)
    assert tabs.image.details(**asked)[box] == f"details of class {a.top_class} at layer 2"
    assert tabs.image.follow_up(loaded.choice, a, "Toy") == {box: "followed up"}
    assert isinstance(tabs.image.follow_up(loaded.choice, a, "Saliency"), type(gr.skip()))  # only when on show
    assert tabs.image.page_for(loaded, shown)[box] == f"model {loaded.name}"


def test_the_wired_events_of_a_new_image_write_the_added_tab(toy_page):
    """Each event of a new image lists the toy's box among its outputs: the upload, the example, the atlas's
    exemplar (their first view), the details and the follow-up; a new model (the Model tab) too."""
    demo, page, *_ = toy_page
    box, s = page.toy.toy_box, page.shared
    writers = {fn.name for fn in demo.fns.values() if box in fn.outputs}
    assert {"upload", "example", "open_exemplar", "details", "follow_up", "load", "from_address"} <= writers
    assert {fn.name for fn in demo.fns.values() if s.image_in in fn.inputs and box in fn.outputs} >= {"upload"}


def test_every_step_writes_only_what_its_event_lists(toy_page):
    """Each step of a new image, with every tab of the list taking part, writes only components its event lists
    as outputs (Gradio refuses any other: "not specified as output of function")."""
    demo, page, tabs, loaded = toy_page
    shown, s = tuple(page.ca.ca_props.value), page.shared
    results = set(tabs.image.results())
    a = session.analyse(loaded, str(SCENE))
    assert set(tabs.image.cleared(shown)) <= results
    assert set(tabs.image.first_view(loaded, a, LOOK, shown, uploaded=False)) <= results
    asked = dict(choice=loaded.choice, analysis=a, **vars(LOOK), th_layer=2, th_row=1, th_col=1, region_of=None)
    detailed = {s.json_file, *(c for tab in tabs.all for c in tab.detailed())}
    assert set(tabs.image.details(**asked)) <= detailed
    assert set(tabs.image.page_for(loaded, shown)) <= set(page.everything())
