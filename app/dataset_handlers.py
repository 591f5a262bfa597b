"""What the Dataset tab's events do (`app.dataset_view` has its parts): open an atlas, pick a head, build an
atlas of the shipped test scenes for the page's model, and open an exemplar in the single-image tabs with its
head enlarged. Each returns {component: new value}, as `app.handlers` does."""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from app import dataset_view as dv
from app import torch_thread
from app.handlers import Handlers
from app.layout import CLASS_ATTENTION_TAB, Page
from app.models import ModelChoice
from app.workdir import WORK
from cait.data import DataError
from cait.data.image_file import IMAGE_ERRORS
from cait.figures.attention import head_name

log = logging.getLogger("cait.app")
BUILT = "atlases"  # the work folder's sub-folder of the atlases built in the app


@dataclass(frozen=True)
class AtlasPlaces:
    """Where the server finds atlases: one to open on every new page (--atlas), a folder to offer (--atlas-dir)."""

    opened: str | None = None
    folder: str | None = None

    @classmethod
    def of(cls, atlas: str | None, folder: str | None) -> "AtlasPlaces":
        """--atlas-dir defaults to the folder of --atlas, else out/."""
        return cls(atlas, folder or (str(Path(atlas).parent) if atlas else "out"))

    def served(self) -> list[str]:
        """Folders whose atlas.html pages the app links to (Gradio's allowed_paths)."""
        return [str(Path(p).resolve()) for p in (self.opened, self.folder) if p]


def scenes_args(choice: ModelChoice, scenes: int, out: Path, device: str) -> argparse.Namespace:
    """`python -m cait.atlas`'s arguments for the first `scenes` test scenes and the page's model, into `out`
    (its own defaults for everything else; no loader processes inside the server)."""
    from cait.atlas.__main__ import parse_args

    flags = ["--data", dv.SCENES, "--limit", str(scenes), "--out", str(out), "--workers", "0", "--device", device]
    flags += ["--model", choice.name] if choice.name else []
    flags += ["--checkpoint", choice.checkpoint] if choice.checkpoint else []
    flags += ["--pretrained"] * choice.download + ["--random-init"] * choice.random_init
    return parse_args(flags)


class DatasetHandlers:
    def __init__(self, page: Page, handlers: Handlers, places: AtlasPlaces):
        self.page, self.tab, self.handlers, self.places = page, page.dataset, handlers, places

    def choices(self) -> list[tuple[str, str]]:
        """The atlases to offer: --atlas, those under --atlas-dir, those built here (label, folder)."""
        built = dv.find_atlases(WORK.folder(BUILT))
        found = [Path(self.places.opened)] if self.places.opened else []
        found += [p for p in dv.find_atlases(self.places.folder) if p not in found]
        return [(p.name, str(p)) for p in found] + [(f"built here: {p.name}", str(p)) for p in built]

    def start(self, choice: ModelChoice) -> dict:
        """A new page: the --atlas opened, or the atlases on offer."""
        if self.places.opened:
            return self.open(self.places.opened, choice)
        return {self.tab.pick: gr.Dropdown(choices=self.choices(), value=None)}

    def open(self, folder: str | None, choice: ModelChoice) -> dict:
        """The atlas in `folder`: its overview, heatmap and first head; a folder that is not one is a message."""
        t = self.tab
        out = dict.fromkeys(t.opened)
        out[t.pick] = gr.Dropdown(choices=self.choices(), value=folder, allow_custom_value=True)
        if not folder:
            return out | {t.msg: "", t.head: gr.Dropdown(choices=[], value=None)}
        try:
            atlas = dv.read_atlas(folder)
        except dv.NotAnAtlas as e:
            log.info("could not open an atlas: %s", e)
            return out | {t.msg: f"**Cannot open this atlas:** {e}", t.head: gr.Dropdown(choices=[], value=None)}
        out.update({t.atlas: atlas, t.overview: dv.overview_markdown(atlas), t.heatmap: dv.heatmap(atlas)})
        out[t.msg] = self._model_note(atlas, choice)
        if not atlas.heads:
            return out | {t.msg: "**This atlas holds no readable image.**", t.head: gr.Dropdown(choices=[])}
        out[t.head] = gr.Dropdown(choices=atlas.head_choices(), value=0)
        return out | self.show_head(atlas, 0, choice)

    def _model_note(self, atlas: dv.Atlas, choice: ModelChoice) -> str:
        if dv.same_model(atlas.model_choice(), choice):
            return ""
        return (
            f"This atlas was made with another model than this page's ({choice}): an exemplar opens with the "
            f"page's model. Load the atlas's model in the Model tab to see its heads."
        )

    def show_head(self, atlas: dv.Atlas | None, k: int | None, choice: ModelChoice) -> dict:
        """Head k's numbers, its mean DLA per class and its exemplars (the images as the atlas read them)."""
        t = self.tab
        if atlas is None or k is None:
            return {t.numbers: None, t.per_class: None, t.exemplars: None}
        k = int(k)
        tiles, missing = self._tiles(atlas, atlas.exemplars(k), choice)
        out = {
            t.numbers: dv.head_numbers(atlas, k),
            t.per_class: dv.class_numbers(atlas, k),
            t.exemplars: gr.update(value=tiles or None, columns=atlas.columns()),
        }
        return out | ({t.msg: missing} if missing else {})

    def _tiles(self, atlas: dv.Atlas, exemplars: list[dv.Exemplar], choice: ModelChoice) -> tuple[list, str]:
        """(image file, caption) per exemplar that can be read, and a message naming those that cannot."""
        folder, tiles, failed = WORK.request_dir(), [], []
        try:
            images, index = dv.atlas_images(atlas, self.handlers.cache.get(choice).cfg)
        except (DataError, dv.NotAnAtlas) as e:
            return [], f"**The atlas's images cannot be read here:** {e}"
        for j, e in enumerate(exemplars):
            try:
                image = images.image(index[e.path])
            except (KeyError, *IMAGE_ERRORS):
                failed.append(e.path)
                continue
            image.save(folder / f"exemplar_{j}.png")
            tiles.append((str(folder / f"exemplar_{j}.png"), e.caption))
        missing = f"**Missing or unreadable in the atlas's data:** {', '.join(failed)}" if failed else ""
        return tiles, missing

    def open_exemplar(self, choice, shown, cmap, alpha, scale, view, keep, th_layer, atlas, k, evt: gr.SelectData):
        """A click on an exemplar: that image analysed in the single-image tabs by the page's model, with the
        head enlarged in the Class attention tab (when the page's model has it), and that tab shown."""
        p, t = self.page, self.tab
        if atlas is None or k is None:
            return {t.msg: "**Open an atlas first.**"}
        exemplar = atlas.exemplars(int(k))[int(evt.index)]
        try:
            path = self._image_file(atlas, exemplar, choice)
        except (DataError, dv.NotAnAtlas, KeyError, *IMAGE_ERRORS) as e:
            problem = f"{exemplar.path} is no longer in the atlas's data" if isinstance(e, KeyError) else str(e)
            log.info("could not open an exemplar: %s", problem)
            return {t.msg: f"**Cannot open this exemplar:** {problem}"}
        entry = atlas.heads[int(k)]
        cfg = self.handlers.cache.get(choice).cfg
        head = (entry["layer"] - 1, entry["head"] - 1)
        fits = head[0] < cfg.depth_token_only and head[1] < cfg.num_heads
        same = dv.same_model(atlas.model_choice(), choice)
        selected = (head[0], head[1] + 1) if fits and same else None  # the enlarged tile: 0 is the head mean
        look = (cmap, alpha, scale, view, keep)
        out = self.handlers.analyse_path(choice, path, look, th_layer, shown, uploaded=False, selected=selected)
        out[p.image_in] = path
        out[p.tabs] = gr.Tabs(selected="ca")
        out[p.open_tab] = CLASS_ATTENTION_TAB
        out[t.msg] = self._model_note(atlas, choice)
        if out.get(p.analysis) is not None:
            name = head_name(head[0], head[1])
            out[p.status] += (
                f"  \nFrom the atlas {atlas.folder.name}: {exemplar.kind} exemplar of {name}, {exemplar.path}."
            )
        return out

    def _image_file(self, atlas: dv.Atlas, exemplar: dv.Exemplar, choice: ModelChoice) -> str:
        """The exemplar as a PNG file in the work folder (built-in scenes have no file of their own)."""
        images, index = dv.atlas_images(atlas, self.handlers.cache.get(choice).cfg)
        image = images.image(index[exemplar.path])
        path = WORK.request_dir() / f"{Path(exemplar.path).stem}.png"
        image.save(path)
        return str(path)

    def build(self, choice: ModelChoice, scenes: float, progress=gr.Progress(track_tqdm=True)) -> dict:
        """An atlas of the first `scenes` test scenes for the page's model (`cait.atlas`, in this process: its
        progress bar is the page's), into the work folder, then opened."""
        n = int(scenes or 0)
        if not 1 <= n <= dv.MAX_SCENES:
            return {self.tab.msg: f"**Choose 1 to {dv.MAX_SCENES:,} scenes** (got {n})."}
        loaded = self.handlers.cache.get(choice)
        name = loaded.name.replace("/", "_")
        out = Path(tempfile.mkdtemp(dir=WORK.folder(BUILT), prefix=f"{name}-scenes{n}-"))
        progress(0, desc=f"atlas of {n} scenes: loading the model and the scenes")
        from cait.atlas.run import run

        try:
            run(scenes_args(choice, n, out, loaded.device.type))
        except (ValueError, OSError) as e:  # the atlas's and the reader's one-line errors
            shutil.rmtree(out, ignore_errors=True)
            first = (str(e).splitlines() or [type(e).__name__])[0]
            log.info("could not build an atlas: %s", first)
            return {self.tab.msg: f"**Could not build the atlas:** {first}"}
        return self.open(str(out), choice)


def wire(p: Page, h: Handlers, places: AtlasPlaces, demo: gr.Blocks, details: dict, open_tab: dict) -> None:
    """The Dataset tab's events; `details` and `open_tab`: the follow-ups of a new image (`app.ui`), after an
    exemplar opens."""
    t, dh = p.dataset, DatasetHandlers(p, h, places)
    model = dict(concurrency_id="model", api_visibility="private")
    on_torch = torch_thread.handler  # the page's model may have to be loaded (its config reads the atlas's data)
    demo.load(on_torch(dh.start), p.choice, t.opened, **model)
    t.pick.input(on_torch(dh.open), [t.pick, p.choice], t.opened, **model)
    head_shown = [t.numbers, t.per_class, t.exemplars, t.msg]
    t.head.input(on_torch(dh.show_head), [t.atlas, t.head, p.choice], head_shown, **model)
    t.build.click(
        torch_thread.handler(dh.build, batched=True),
        [p.choice, t.scenes],
        t.opened,
        show_progress_on=[t.overview],
        **model,
    )
    view = [*p.look, p.th_layer]
    t.exemplars.select(
        torch_thread.handler(dh.open_exemplar),
        [p.choice, p.ca_props, *view, t.atlas, t.head],
        [*p.results, p.image_in, p.tabs, p.open_tab, t.msg],
        show_progress_on=[p.top5],
        **model,
    ).success(**details).success(**open_tab)
