"""What the page asks of every tab (`PageTab`): `app.ui` keeps one list of tabs and loops over it in every step of
a new image or model."""

from __future__ import annotations

from typing import Any

import gradio as gr


class PageTab:
    """A tab's part in each step of the page; each default takes no part. `results`: what a new image writes here
    (the first view empties what it does not fill; `cleared` empties it, `shown`: the class-attention galleries'
    props); `at_first_view`: shown with a new image's first view; `details` (writing `detailed`): the follow-up
    of a new image (ask: `app.ui.DetailsAsk`); `follow_up` (writing `followed`): what the tab computes of a new
    image when it is on show; `for_model`: what it says of a new model; `wire`: its own events; `wire_image_picks`:
    its tiles that open an image."""

    parts: Any  # the tab's components
    kept_on_new_model = False  # a new model leaves the tab as it is (the Dataset tab's open atlas)

    @classmethod
    def on_page(cls, parts: Any, page: Any) -> PageTab:
        """The tab's events on `page` (`app.ui.Tabs`: the shared components, the cache, the default model...)."""
        return cls(parts, page.shared, page.cache)

    def results(self) -> list:
        return getattr(self.parts, "results", [])

    def cleared(self, shown: tuple) -> dict:
        return dict.fromkeys(self.results())

    def at_first_view(self, loaded: Any, a: Any) -> dict:
        return {}

    def for_model(self, loaded: Any) -> dict:
        return {}

    def detailed(self) -> list:
        return []

    def details(self, loaded: Any, a: Any, ask: Any) -> dict:
        return {}

    def followed(self) -> list:
        return []

    def follow_up(self, choice: Any, a: Any, request: Any, progress: Any) -> Any:
        return gr.skip()

    def wire(self, demo: gr.Blocks, page: Any) -> None:
        pass

    def wire_image_picks(self, demo: gr.Blocks, page: Any, outputs: list) -> list:
        """The tab's galleries whose tile opens as the page's image, wired to write `outputs` (a new image's first
        view): (the trigger, its event) each, for the page to chain the rest of a new image on."""
        return []
