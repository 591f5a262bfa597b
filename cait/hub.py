"""Where a variant's pretrained weights come from: shipped in this package (our Fashion-MNIST models) or
timm's files on the Hugging Face Hub (the paper's ImageNet models, `timm/<variant>.fb_dist_in1k`).

huggingface_hub does all Hub and cache work: the cache layout, downloads (to a temporary file renamed
into place only once complete, so an interrupted download leaves nothing a later call could take for
good) and the environment (`HF_HOME`, `HF_HUB_CACHE`, `HF_ENDPOINT`, `HF_HUB_OFFLINE`), which it reads
itself. Which repo holds a variant's weights is timm's fact (its pretrained configs), not ours.

    weights_status(name)   where the weights would come from and their size, without any request
    variant_status(name, cfg)  the same, for a caller that has read the variant's config (`cait.load_model`)
    list_weights()         that, for every paper variant (the app's Model tab)
    fetch_weights(status)  the local file: shipped, in the cache, or downloaded now with progress
    missing_weights(status)  the one line every tool says when there are none and no random init was asked for
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Literal

import torch

from .checkpoint import WEIGHTS_DIR, CheckpointError, atomic_write
from .config import RELEASED, VARIANTS, CaiTConfig, get_config, is_paper_variant
from .runtime import user_cache_dir

# timm's file name for safetensors weights on the Hub (timm.models._hub.HF_SAFE_WEIGHTS_NAME).
HUB_FILENAME = "model.safetensors"

Where = Literal["shipped", "cached", "download", "needs file"]
ProgressCallback = Callable[[int, "int | None"], None]  # (bytes done, total bytes or None when unknown)


class WeightsUnavailable(CheckpointError):
    """A variant's pretrained weights are not on this machine and cannot be fetched now; the message
    names the variant, its repo and the ways out."""


@dataclass(frozen=True)
class WeightsStatus:
    name: str  # the variant (cait.list_models())
    where: Where  # "shipped": in this package; "cached": in the local Hugging Face cache;
    # "download": fetched from the Hub on first use; "needs file": offline (or no
    # released weights) and not cached, so only checkpoint=PATH gives weights
    repo_id: str | None  # timm's Hub repo of the released weights; None for variants without any
    size_mb: float  # the file's size when local, else the size of its float32 tensors (what timm's
    # files hold), in MB of 10^6 bytes
    path: Path | None  # the local file when shipped or cached

    def describe(self) -> str:
        """One line for a user: where the weights come from and how big they are."""
        size = f"{self.size_mb:.0f} MB" if self.size_mb >= 10 else f"{self.size_mb:.1f} MB"
        return {
            "shipped": f"shipped with the package ({size})",
            "cached": f"in the local Hugging Face cache ({size}, {self.repo_id})",
            "download": f"download {size} from the Hugging Face Hub ({self.repo_id})",
            "needs file": f"needs a weights file (checkpoint=PATH; {size})"
            + (
                f": {self.repo_id} is not cached and the Hub is off (HF_HUB_OFFLINE)"
                if self.repo_id
                else ": no released weights for this size"
            ),
        }[self.where]


def hub_repo(name: str) -> str | None:
    """timm's Hugging Face repo holding `name`'s released weights (e.g. 'timm/cait_s24_224.fb_dist_in1k'),
    from timm's pretrained config of that variant; None for variants released by nobody."""
    repo = timm_sources().get(name, {}).get("hf_hub_id")
    return repo.split("@")[0] if repo else None


def official_url(name: str) -> str | None:
    """Where the official deit release of `name` lives (a .pth that checkpoint=PATH reads), per timm."""
    return timm_sources().get(name, {}).get("url") or None


@lru_cache(maxsize=1)
def timm_sources() -> dict[str, dict[str, str | None]]:
    """{variant: {"hf_hub_id", "url"}} from timm's pretrained config of every paper variant, read from timm once
    per timm version and kept in the user cache dir: importing timm.models registers every architecture, about
    2 s of every app start otherwise. timm stays the owner of the fact; another timm version reads it again."""
    path = user_cache_dir() / f"timm-{importlib.metadata.version('timm')}-sources.json"
    try:
        known = json.loads(path.read_text())
        if isinstance(known, dict) and all(isinstance(v, dict) for v in known.values()):
            return known
    except (OSError, ValueError):
        pass
    from timm.models import get_pretrained_cfg

    sources = {}
    for name in filter(is_paper_variant, VARIANTS):
        cfg = get_pretrained_cfg(name)
        sources[name] = {"hf_hub_id": cfg and cfg.hf_hub_id, "url": cfg and cfg.url}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: f.write(json.dumps(sources, indent=1).encode()))
    except OSError:  # not writable: the next start reads timm again
        pass
    return sources


def cached_file(name: str) -> Path | None:
    """`name`'s weights in the local Hugging Face cache (the revision `main` points to), without any request."""
    from huggingface_hub import try_to_load_from_cache

    repo = hub_repo(name)
    found = try_to_load_from_cache(repo, HUB_FILENAME) if repo else None
    return Path(found) if isinstance(found, str) else None  # a str is a file; None/_CACHED_NO_EXIST are not


def weights_status(name: str) -> WeightsStatus:
    """Where `name`'s pretrained weights would come from now, and their size. Makes no request."""
    return variant_status(name, get_config(name))


def variant_status(name: str, cfg: CaiTConfig) -> WeightsStatus:
    """`weights_status` of `name`, whose config `cfg` the caller has read already (a load reads it once)."""
    from huggingface_hub import is_offline_mode

    if cfg.pretrained:
        where: Where = "shipped"
        repo, path = None, WEIGHTS_DIR / cfg.pretrained
        path = path if path.is_file() else None
    else:
        repo, path = hub_repo(name), cached_file(name)
        where = "cached" if path else "download" if repo and not is_offline_mode() else "needs file"
    return WeightsStatus(name, where, repo, _megabytes(path) if path else _float32_mb(cfg), path)


def missing_weights(status: WeightsStatus) -> str:
    """The one line every tool says when a variant has no weights here and no random init was asked for
    (`cait.load_model`'s policy)."""
    name, repo = status.name, status.repo_id
    why = {
        "shipped": f"its file is not in this package (train it with `python -m cait.train --model {name}`)",
        "download": f"timm's {repo} is not in the local Hugging Face cache",
        "needs file": f"timm's {repo} is not cached and the Hub is off (HF_HUB_OFFLINE)"
        if repo
        else "there are no released weights for this size",
    }[status.where]
    ways = ["--checkpoint FILE gives a weights file"]
    if repo:
        online = "" if status.where == "download" else "online, "
        ways.insert(0, f"{online}--pretrained (the app: the download box) downloads them ({status.size_mb:.0f} MB)")
        ways.append("HF_HOME pointing at a Hugging Face cache that holds them")
    ways.append("--random-init for a seeded untrained model, flagged on every output")
    return f"no weights for '{name}' here: {why}. Ways out: {'; '.join(ways)}"


def cached_variants() -> list[str]:
    """The released variants whose official weights are in the local Hugging Face cache (no request)."""
    return [name for name in RELEASED if cached_file(name) is not None]


def list_weights(names: list[str] | None = None) -> list[WeightsStatus]:
    """`weights_status` of each of `names` (default: every paper variant, released or not)."""
    return [weights_status(n) for n in (names or [n for n in VARIANTS if is_paper_variant(n)])]


def _megabytes(path: Path) -> float:
    return path.stat().st_size / 1e6


@lru_cache(maxsize=None)  # a variant's size never changes; the app asks again after every model load
def _float32_mb(cfg: CaiTConfig) -> float:
    """Counted on a copy with one block of each kind, on the meta device (shapes only): the blocks of a kind
    are alike, so the rest follows by multiplication, at a fraction of the time of building every block."""
    from .model import CaiT

    with torch.device("meta"):
        model = CaiT(cfg.replace(depth=1, depth_token_only=1), init_weights=False)
    count = lambda module: sum(t.numel() for t in module.state_dict().values())
    sa, ca = count(model.blocks[0]), count(model.blocks_token_only[0])
    return (count(model) + (cfg.depth - 1) * sa + (cfg.depth_token_only - 1) * ca) * 4 / 1e6


@dataclass(frozen=True)
class LocalWeights:
    path: Path  # the file to read (read_checkpoint)
    source: str  # what the weights are, for the app and the figures' provenance lines


def fetch_weights(
    status: WeightsStatus, *, tqdm_class: type | None = None, on_progress: ProgressCallback | None = None
) -> LocalWeights:
    """The local file of the pretrained weights `status` (`weights_status`) describes: shipped with the
    package, in the local Hugging Face cache (no request), or downloaded now into that cache. Raises
    WeightsUnavailable, naming the ways out, when there are none (offline and not cached, download failed,
    or never released).

    tqdm_class: progress bar class for the download (default: huggingface_hub's, which
        HF_HUB_DISABLE_PROGRESS_BARS turns off); on_progress(done_bytes, total_bytes) is called as
        bytes arrive, e.g. to drive a GUI progress bar.
    """
    name, repo = status.name, status.repo_id
    if status.where == "shipped":
        if status.path is None:
            # (also a variant declared in VARIANTS before its weights are trained and shipped)
            raise WeightsUnavailable(
                f"no shipped weights for '{name}' in this package (its file is not in {WEIGHTS_DIR}): train them "
                f"with `python -m cait.train --model {name}` and ship them with scripts/ship_model.py, or pass "
                f"checkpoint=PATH"
            )
        return LocalWeights(status.path, status.path.name)
    if repo is None:
        kind = (
            "a paper size without a public checkpoint"
            if is_paper_variant(name)
            else "a small config we have not shipped"
        )
        raise WeightsUnavailable(f"no released weights for '{name}' ({kind}); pass your own with checkpoint=PATH")
    # Released weights never change on the Hub: a cached copy is used without asking the Hub again, so a
    # machine with a flaky network does not wait for a timeout on every load.
    path = status.path or _download(status, tqdm_class, on_progress)
    return LocalWeights(path, f"{repo} ({HUB_FILENAME})")


def _download(status: WeightsStatus, tqdm_class: type | None, on_progress: ProgressCallback | None) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if on_progress is not None:
        tqdm_class = _reporting(tqdm_class, on_progress)
    try:
        return Path(hf_hub_download(status.repo_id, HUB_FILENAME, tqdm_class=tqdm_class))
    except LocalEntryNotFoundError as e:  # offline, or the Hub unreachable, and not in the cache
        raise WeightsUnavailable(_unavailable(status, _why_offline(e))) from None
    except Exception as e:  # an interrupted download, a server error, a missing repo: the client kept nothing
        raise WeightsUnavailable(
            _unavailable(status, f"the download failed ({type(e).__name__}: {_first_line(e)}); nothing of it was kept")
        ) from None


def _why_offline(error: Exception) -> str:
    from huggingface_hub import constants, is_offline_mode

    if is_offline_mode():
        return "offline mode is on (HF_HUB_OFFLINE=1)"
    cause = error.__cause__
    detail = f": {type(cause).__name__}: {_first_line(cause)}" if cause is not None else ""
    return f"the Hub at {constants.ENDPOINT} could not be reached{detail}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _unavailable(status: WeightsStatus, why: str) -> str:
    from huggingface_hub import constants, is_offline_mode

    name, repo = status.name, status.repo_id
    deit = official_url(name)
    official = f"the official deit file ({deit}) " if deit else "the official deit .pth "
    online = "go online (unset HF_HUB_OFFLINE)" if is_offline_mode() else "go online"
    return (
        f"no weights for '{name}': timm's {repo} ({HUB_FILENAME}) is not in the local Hugging Face cache "
        f"({constants.HF_HUB_CACHE}) and {why}. Ways out: {online} and run again "
        f"to download it once ({status.size_mb:.0f} MB); or give a file, checkpoint=PATH (--checkpoint PATH on "
        f"the command line), with {official}or a timm .pth/.safetensors; or point HF_HOME / HF_HUB_CACHE at a "
        f"cache that holds {repo}"
    )


def _reporting(base: type | None, on_progress: ProgressCallback) -> type:
    """A tqdm class (huggingface_hub's unless `base` is given) that also calls on_progress(done, total)."""
    if base is None:
        from huggingface_hub.utils import tqdm as base

    class Reporting(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # Counted here: a disabled bar (no terminal) does not advance its own counter.
            self._done, self._total = kwargs.get("initial", 0) or 0, kwargs.get("total")

        def update(self, n=1):
            self._done += n
            on_progress(self._done, self._total)
            return super().update(n)

    return Reporting
