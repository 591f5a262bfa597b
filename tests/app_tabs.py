"""The app's page and its tabs' events on one cache, without a server (components only): what the handler tests
call, as the wired page calls it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from types import SimpleNamespace

from app.models import ModelCache, ModelChoice
from app.tabs.dataset import AtlasPlaces
from app.ui import Page, Tabs, compose


@dataclass
class PageUnderTest:
    page: Page
    tabs: Tabs
    cache: ModelCache
    default: ModelChoice

    @property
    def p(self) -> SimpleNamespace:
        """Every component of the page by its name (the names are unique across the page)."""
        found = {}
        for parts in (self.page.shared, *self.page.parts.values()):
            for f in fields(parts):  # a dict of components (the method options' controls): each by its name
                value = getattr(parts, f.name)
                found.update(value if isinstance(value, dict) else {f.name: value})
        return SimpleNamespace(**found)


def page_under_test(cache: ModelCache, choice: ModelChoice, places: AtlasPlaces | None = None) -> PageUnderTest:
    """The page of a session that starts with `choice` (loaded from `cache`) and its tabs' events."""
    _, page, tabs = compose(cache.get(choice), cache, places or AtlasPlaces.of(None, None))
    return PageUnderTest(page, tabs, cache, choice)
