"""Official weights through huggingface_hub (cait.hub), tested against a stand-in Hub on 127.0.0.1.

The stand-in answers the Hub's file endpoint (HEAD/GET /{repo}/resolve/{revision}/{file}) with the headers
huggingface_hub 2.4 reads (X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size, Content-Length; Range
for resumed downloads; X-Error-Code on errors) and serves a timm-format safetensors of cait_xxs24_224
with random weights, gammas randomised. The environment is set as a user would set it (HF_ENDPOINT,
HF_HOME, HF_HUB_OFFLINE): in-process tests through the `hf_env` fixture (conftest.py), which reloads
huggingface_hub.constants, where the client reads it; the analysis test calls the scripts' mains in
that environment. The stand-in is tests/stand_in_hub.py.
Nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib
import torch
import tqdm
from _paper import MAIN_TABLE
from huggingface_hub import file_download
from huggingface_hub.utils import _http
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from PIL import Image
from safetensors.torch import save
from stand_in_hub import StandInHub

import cait
from cait import explain, hub
from cait.config import RELEASED, VARIANTS, is_paper_variant
from cait.data.photos import PHOTOS, available_photos
from cait.explain import layerscale
from cait.runtime import CACHE_ENV

NAME = "cait_xxs24_224"
REPO = "timm/cait_xxs24_224.fb_dist_in1k"  # written out: the id timm's model card gives
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def timm_file(twins) -> tuple[bytes, torch.nn.Module]:
    """The served model.safetensors (timm's layout) and timm's model holding the same weights."""
    _, theirs = twins(NAME, seed=7)  # random weights, gammas far from their init
    return save({k: v.contiguous() for k, v in theirs.state_dict().items()}), theirs


@pytest.fixture(scope="module")
def served(timm_file):
    with StandInHub({f"{REPO}/{hub.HUB_FILENAME}": timm_file[0]}) as stand_in:
        yield stand_in


@pytest.fixture
def stand_in(served) -> StandInHub:
    served.requests.clear()
    return served


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------------------------- repo ids, status


def test_repo_ids_come_from_timm_and_cover_exactly_the_released_variants():
    assert hub.hub_repo(NAME) == REPO
    assert {n for n in VARIANTS if hub.hub_repo(n)} == set(RELEASED)
    assert hub.hub_repo("cait_nano_64") is None and hub.official_url("cait_s24_224").endswith("/S24_224.pth")


SOURCES = "from cait import hub; import sys; print(hub.hub_repo('cait_xxs24_224'), 'timm.models' in sys.modules)"


def test_timms_sources_are_kept_so_that_later_starts_skip_importing_timm_models(tmp_path, monkeypatch):
    """Importing timm.models costs about 2 s of the app's start: it happens once per timm version. The later start
    is a fresh interpreter, the only place where `timm.models` not being imported can be seen; the first start and
    the torn file's are this process with the remembered answer forgotten, the file showing that timm was asked."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    hub.timm_sources.cache_clear()
    try:
        assert hub.hub_repo(NAME) == REPO  # the first start asks timm and keeps its answer
        (kept,) = tmp_path.glob("timm-*-sources.json")
        assert json.loads(kept.read_text())[NAME]["hf_hub_id"] == REPO
        later = subprocess.run([sys.executable, "-c", SOURCES], capture_output=True, text=True, check=True)
        assert later.stdout.split() == [REPO, "False"]
        kept.write_text("{not json")  # a torn or foreign file is read again from timm and rewritten
        hub.timm_sources.cache_clear()
        assert hub.hub_repo(NAME) == REPO and json.loads(kept.read_text())[NAME]["hf_hub_id"] == REPO
    finally:
        hub.timm_sources.cache_clear()  # the next caller reads the sources of its own cache dir


def test_status_lists_every_paper_variant_with_its_size():
    listed = {s.name: s for s in hub.list_weights()}
    assert list(listed) == [n for n in VARIANTS if is_paper_variant(n)]
    for row in MAIN_TABLE:  # float32 files: 4 bytes per parameter of the paper's count (224 px variants)
        status = listed.get(row.variants[0])
        if status is not None and status.name.endswith("_224"):
            assert status.size_mb == pytest.approx(4 * row.params_m, rel=0.02), status
    assert listed["cait_s36_224"].where == "needs file" and listed["cait_s36_224"].repo_id is None
    shipped = hub.weights_status("cait_nano_28")
    assert shipped.where == "shipped" and shipped.size_mb == shipped.path.stat().st_size / 1e6
    with pytest.raises(
        hub.WeightsUnavailable, match=r"'cait_s36_224' \(a paper size without a public.*checkpoint=PATH"
    ):
        cait.load_model("cait_s36_224", pretrained=True)
    with pytest.raises(hub.WeightsUnavailable, match=r"'cait_micro_64' \(a small config we have not shipped\)"):
        cait.load_model("cait_micro_64", pretrained=True)


# ------------------------------------------------------------------------------------------ download, cache, offline


class RecordingBar(tqdm.tqdm):
    made: list["RecordingBar"] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "disable": True})
        self.total_given, self.bytes_seen = kwargs.get("total"), 0
        RecordingBar.made.append(self)

    def update(self, n=1):
        self.bytes_seen += n
        return super().update(n)


def test_download_with_progress_then_the_cache_then_offline_give_timms_logits(stand_in, hf_env, timm_file):
    data, theirs = timm_file
    cache = hf_env(stand_in.url)
    assert hub.weights_status(NAME).where == "download" and hub.cached_variants() == []
    progress: list[tuple[int, int | None]] = []
    RecordingBar.made.clear()
    got = hub.fetch_weights(
        hub.weights_status(NAME),
        tqdm_class=RecordingBar,
        on_progress=lambda done, total: progress.append((done, total)),
    )
    assert stand_in.methods() == ["HEAD", "GET"], stand_in.requests
    requests = len(stand_in.requests)
    assert got.path.read_bytes() == data and got.path.is_relative_to(cache.resolve())  # under HF_HOME/hub
    assert progress[-1] == (len(data), len(data)) and len(progress) >= 2
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    assert [(bar.total_given, bar.bytes_seen) for bar in RecordingBar.made] == [(len(data), len(data))]
    status = hub.weights_status(NAME)
    assert status.where == "cached" and status.path == got.path and status.size_mb == len(data) / 1e6
    assert hub.cached_variants() == [NAME]  # what the app's first screen offers

    assert (
        hub.fetch_weights(hub.weights_status(NAME)).path == got.path
    )  # online, the cached copy is used without asking the Hub
    assert len(stand_in.requests) == requests
    hf_env(stand_in.url, offline=True)
    loaded = cait.load_model(NAME)  # cached: no flag needed
    model = loaded.model
    assert len(stand_in.requests) == requests and loaded.source == f"official weights: {REPO} ({hub.HUB_FILENAME})"
    assert loaded.status.where == "cached" and loaded.trained
    assert loaded.weights_id == f"Hub revision {stand_in.commit[:12]}" and loaded.made_from.endswith(loaded.weights_id)
    x = images(1)
    with torch.no_grad():
        torch.testing.assert_close(model(x), theirs(x), atol=1e-4, rtol=0)


def test_offline_with_an_empty_cache_is_one_clear_error_and_no_request(stand_in, hf_env):
    cache = hf_env(stand_in.url, offline=True)
    assert hub.weights_status(NAME).where == "needs file"
    with pytest.raises(cait.CheckpointError) as err:
        cait.load_model(NAME, pretrained=True)
    msg = str(err.value)
    assert isinstance(err.value, hub.WeightsUnavailable) and len(msg.splitlines()) == 1
    for part in (
        f"'{NAME}'",
        REPO,
        "HF_HUB_OFFLINE",
        "go online",
        "checkpoint=PATH",
        "--checkpoint PATH",
        "timm .pth/.safetensors",
        "https://dl.fbaipublicfiles.com/deit/XXS24_224.pth",
        str(cache),
    ):
        assert part in msg, part
    assert stand_in.requests == []


def test_unreachable_hub_is_the_same_clear_error(hf_env, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hf_env(f"http://127.0.0.1:{port}")
    monkeypatch.setattr(_http, "time", SimpleNamespace(sleep=lambda s: None))  # the client's back-off, skipped
    with pytest.raises(hub.WeightsUnavailable, match=rf"'{NAME}'.*could not be reached.*checkpoint=PATH"):
        hub.fetch_weights(hub.weights_status(NAME))


def test_a_download_cut_off_halfway_leaves_nothing_taken_for_good(hf_env, timm_file, monkeypatch):
    data, _ = timm_file
    retries: list[float] = []
    monkeypatch.setattr(file_download, "time", SimpleNamespace(sleep=retries.append))  # the client's resume waits
    with StandInHub({f"{REPO}/{hub.HUB_FILENAME}": data}, die_after=len(data) // 2) as dying:
        cache = hf_env(dying.url)
        with pytest.raises(hub.WeightsUnavailable, match=rf"'{NAME}'.*{REPO}.*download failed.*nothing of it was kept"):
            hub.fetch_weights(hub.weights_status(NAME))
        assert dying.methods() == ["HEAD", "GET"] and retries  # it tried to resume; the server stayed dead
    kept = [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size >= len(data) // 4]
    assert kept == [] and not list(cache.rglob("*.incomplete"))  # neither the half file nor a temporary
    hf_env(dying.url, offline=True)
    assert hub.weights_status(NAME).where == "needs file"
    with pytest.raises(hub.WeightsUnavailable, match="HF_HUB_OFFLINE"):
        cait.load_model(NAME, pretrained=True)


# ---------------------------------------------------------------------------------------------- one way in


def _counting(monkeypatch, function) -> list[str]:
    """Count the calls of `function` through every name a loaded module of cait, app or analysis binds it to."""
    calls: list[str] = []

    def counted(name, *args, **kwargs):
        calls.append(name)
        return function(name, *args, **kwargs)

    for module in list(sys.modules.values()):
        if module.__name__.split(".")[0] in ("cait", "app", "analysis", "_common"):
            for attr, value in list(vars(module).items()):
                if value is function:
                    monkeypatch.setattr(module, attr, counted)
    return calls


@pytest.mark.parametrize(
    "name, random_init", [(cait.DEFAULT_MODEL, False), (NAME, True)], ids=["shipped", "random init"]
)
def test_a_load_reads_the_config_once_and_computes_the_weights_status_once(monkeypatch, name, random_init):
    import argparse

    from app.loading import load_page_model as app_load
    from app.models import ModelChoice
    from cait.factory import load_from_flags

    configs, statuses = _counting(monkeypatch, cait.config.get_config), _counting(monkeypatch, hub.variant_status)
    loads = {
        "cait": lambda: cait.load_model(name, random_init=random_init),
        "app": lambda: app_load(ModelChoice(name, random_init=random_init), torch.device("cpu")),
        "command lines": lambda: load_from_flags(
            argparse.Namespace(model=name, checkpoint=None, pretrained=False, random_init=random_init)
        ),
    }
    for tool, load in loads.items():
        configs.clear(), statuses.clear()
        loaded = load()
        assert (configs, statuses) == ([name], [name]), tool
        assert loaded.notice.startswith("Untrained") == random_init


def test_missing_weights_are_the_same_one_line_from_the_app_evaluate_and_the_analysis_scripts(capsys, tmp_path):
    from layerscale_stats import main as analysis_main

    from app.loading import load_page_model as app_load
    from app.models import ModelChoice
    from cait.evaluate.__main__ import main as evaluate_main

    # the suite runs offline with an empty cache (conftest.py): timm's weights of NAME are not here
    with pytest.raises(hub.WeightsUnavailable) as app_error:
        app_load(ModelChoice(NAME), torch.device("cpu"))
    said = str(app_error.value)
    assert evaluate_main(["--model", NAME]) == 2
    assert capsys.readouterr().err == f"error: {said}\n"
    with pytest.raises(SystemExit) as exit_:
        analysis_main(["--model", NAME, "--out", str(tmp_path)])
    assert exit_.value.code == 2 and capsys.readouterr().err == f"error: {said}\n"
    assert len(said.splitlines()) == 1 and said.startswith(f"no weights for '{NAME}' here")
    for way in ("--pretrained", "--checkpoint FILE", "HF_HOME", "--random-init", "HF_HUB_OFFLINE", REPO):
        assert way in said, way


# ---------------------------------------------------------------------------------------------- an analysis script


def test_analysis_pretrained_draws_the_papers_figure_from_the_downloaded_weights(stand_in, hf_env, tmp_path, twins):
    """The scripts' mains in this process, in the environment a user sets (test_analysis.py runs both scripts as
    `python script.py`): two fresh interpreters would only add their imports of torch, timm and matplotlib."""
    import attention_maps
    import layerscale_stats
    from _common import batch_of, load_examples

    hf_env(stand_in.url)
    out = tmp_path / "fig6"
    assert attention_maps.main(["--model", NAME, "--pretrained", "--quick", "--out", str(out)]) == 0
    assert stand_in.methods() == ["HEAD", "GET"]
    requests = len(stand_in.requests)
    data = json.loads((out / "attention_maps.json").read_text())
    assert data["made_from"].startswith(f"official {NAME} weights, timm's {REPO}")
    photos = [photo for photo, _ in available_photos()][:2]  # --quick: the first two real photos
    assert [r["image"] for r in data["images"]] == [p.name for p in photos]
    for p in photos:
        with Image.open(out / f"attention_{p.name}.png") as im:
            assert im.width > 500
    # the maps are those of the served weights, on the photo as the script sees it
    ours, _ = twins(NAME, seed=7)
    examples = load_examples([photos[0].path], ours.cfg)
    maps = explain.class_attention(ours, batch_of(examples, ours.cfg)).maps[0]
    torch.testing.assert_close(torch.tensor(data["images"][0]["maps"]), maps, atol=1e-5, rtol=0)

    # offline, from the cache: LayerScale per depth of those weights, without a request
    hf_env(stand_in.url, offline=True)
    assert layerscale_stats.main(["--model", NAME, "--pretrained", "--out", str(tmp_path / "ls")]) == 0
    assert len(stand_in.requests) == requests
    rows = json.loads((tmp_path / "ls" / "layerscale_stats.json").read_text())["rows"]
    expected = layerscale.layerscale_stats(ours)
    assert [(r["stage"], r["layer"], r["gamma"]) for r in rows] == [
        (r["stage"], r["layer"], r["gamma"]) for r in expected
    ]
    for key in ("median", "p10", "p90"):
        assert [r[key] for r in rows] == pytest.approx([r[key] for r in expected], rel=1e-6)


# ---------------------------------------------------------------------------------------------- photos, packaging


def test_real_photos_each_once_with_their_licence():
    found = available_photos()
    assert [p for p, _ in found] == list(PHOTOS)  # all present in this installation
    digests = [hashlib.sha256(path.read_bytes()).hexdigest() for _, path in found]
    assert len(set(digests)) == len(digests) and len({p.name for p in PHOTOS}) == len(PHOTOS)
    for photo, path in found:
        assert photo.credit and ("CC0" in photo.credit or "public domain" in photo.credit or "Apache" in photo.credit)
        with Image.open(path) as im:
            assert min(im.size) >= 224 and im.convert("RGB").getbbox() is not None


def test_pyproject_declares_its_dependencies_in_ranges_that_hold_the_pins():
    # that every import is declared: tests/test_declared_imports.py
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}
    extras = {
        canonicalize_name(r.name): r
        for deps in project["optional-dependencies"].values()
        for r in map(Requirement, deps)
        if canonicalize_name(r.name) != canonicalize_name(project["name"])  # an extra that includes another
    }
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("#")[0].strip().split("==")
            pins[canonicalize_name(name)] = version
    for name, req in {**declared, **extras}.items():
        assert name in pins and req.specifier.contains(pins[name]), (req, pins.get(name))


def test_a_variants_float32_size_is_its_full_models():
    """The size counted on one block of each kind equals the whole model's, for every variant."""
    from cait.config import VARIANTS, get_config
    from cait.model import CaiT

    for name in VARIANTS:
        cfg = get_config(name)
        with torch.device("meta"):
            model = CaiT(cfg, init_weights=False)
        assert hub._float32_mb(cfg) == pytest.approx(sum(t.numel() for t in model.state_dict().values()) * 4 / 1e6)
