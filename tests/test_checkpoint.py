"""Checkpoint formats in, our format round trip, and files that must be refused. (Pretrained weights from the
Hugging Face Hub and its cache: tests/test_hub.py.)"""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from safetensors.torch import save_file

import cait
from cait.checkpoint import CheckpointError, atomic_write, grow_depth, load_into, stored_config
from cait.config import VARIANTS

SMALL = "cait_pico_32"


def images(cfg: cait.CaiTConfig, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, cfg.in_chans, cfg.img_size, cfg.img_size, generator=torch.Generator().manual_seed(0))


def assert_reproduces(model: cait.CaiT, timm_model: torch.nn.Module) -> None:
    x = images(model.cfg)
    with torch.no_grad():
        torch.testing.assert_close(model(x), timm_model(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", ["deit", "deit-ddp", "timm-pth", "timm-safetensors"])
def test_published_formats_load_strict_and_reproduce_timm(tmp_path, twins, layout):
    _, theirs = twins(SMALL, seed=3)
    state = theirs.state_dict()
    if layout == "timm-safetensors":
        path = tmp_path / "model.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        path = tmp_path / "checkpoint.pth"
        if layout == "deit":  # official deit release: {"model": state_dict, ...}
            obj = {"model": state}
        elif layout == "deit-ddp":  # saved from DistributedDataParallel: keys prefixed with "module."
            obj = {"model": {f"module.{k}": v for k, v in state.items()}, "epoch": 299}
        else:
            obj = state
        torch.save(obj, path)
    loaded = cait.load_model(SMALL, path)
    model = loaded.model
    assert (
        not model.training
        and loaded.source == f"checkpoint {path}"
        and loaded.made_from.startswith(f"checkpoint {path.name}")
    )
    assert stored_config(path) is None  # published files carry no config of ours: the name says the variant
    assert_reproduces(model, theirs)


def test_our_weights_round_trip_with_their_config(tmp_path, twins):
    ours, _ = twins(SMALL, seed=4)
    # A config that differs from the named variant: the file alone must be enough to rebuild it.
    model = cait.CaiT(ours.cfg.replace(num_classes=3, labels=("a", "b", "c"))).eval()
    path = tmp_path / "mine.safetensors"
    cait.save_weights(model, path, {"note": "test"})
    back = cait.load_model(None, checkpoint=path).model
    assert back.cfg == model.cfg and stored_config(path) == model.cfg  # the header alone says it too
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # readable by whom the umask allows, not 0600
    assert back.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())
    x = images(model.cfg)
    with torch.no_grad():
        assert torch.equal(back(x), model(x))
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # the atomic write cleaned up
    # the same weights and metadata again (a re-ship): the file is left as it is, not rewritten
    before = path.stat()
    cait.save_weights(model, path, {"note": "test"})
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    cait.save_weights(model, path, {"note": "other"})  # other metadata: written
    assert path.stat().st_ino != before.st_ino
    before = path.stat()
    with torch.no_grad():
        model.head.bias.add_(1.0)
    cait.save_weights(model, path, {"note": "other"})  # other weights: written
    assert path.stat().st_ino != before.st_ino
    assert torch.equal(cait.load_model(None, checkpoint=path).model.head.bias, model.head.bias)


def _empty_state(name: str) -> dict[str, torch.Tensor]:
    # Right names and shapes, no init (torch.empty does not touch the memory): cheap even for S-24.
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in cait.CaiT(VARIANTS[name]).state_dict().items()}
    return {k: torch.empty(s) for k, s in shapes.items()}


@pytest.mark.parametrize(
    "source, target, sections",
    [
        ("cait_s24_224", "cait_xxs24_224", ["shape mismatches"]),
        ("cait_xxs36_224", "cait_xxs24_224", ["unexpected keys"]),
        ("cait_xxs24_224", "cait_xxs36_224", ["missing keys"]),
    ],
)
def test_wrong_variant_names_the_likely_one(source, target, sections):
    with torch.device("meta"):
        model = cait.CaiT(VARIANTS[target])
    with pytest.raises(CheckpointError) as err:
        load_into(model, _empty_state(source), "weights.pth")
    msg = str(err.value)
    assert f"'{source}'" in msg and "weights.pth" in msg
    for section in ("missing keys", "unexpected keys", "shape mismatches"):
        assert (section in msg) == (section in sections), msg
    if "shape mismatches" in sections:
        assert "cls_token: checkpoint (1, 1, 384) vs model (1, 1, 192)" in msg
    if "unexpected keys" in sections:
        assert "blocks.24." in msg


def test_wrong_file_through_load_model(tmp_path):
    path = tmp_path / "nano.pth"
    torch.save({"model": cait.load_model("cait_nano_64", weights=False).model.state_dict()}, path)
    with pytest.raises(CheckpointError, match="'cait_nano_64'"):
        cait.load_model(SMALL, checkpoint=path)


class _Payload:
    """Pickles to a call of os.system: unpickling it would run the command."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, writer):
    marker = tmp_path / "pwned"
    payload = {"model": {"w": torch.zeros(1)}, "evil": _Payload(f"touch {marker}")}
    path = tmp_path / "evil.pth"
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(payload, f, protocol=2)  # torch.load warns about newer protocols
    with pytest.raises(CheckpointError, match="refused"):
        cait.load_model(SMALL, checkpoint=path)
    assert not marker.exists()


@pytest.fixture
def real_files(tmp_path):
    model = cait.load_model(SMALL, weights=False).model
    pth, st = tmp_path / "w.pth", tmp_path / "w.safetensors"
    torch.save(model.state_dict(), pth)
    cait.save_weights(model, st)
    return pth, st


@pytest.mark.parametrize("which", [0, 1], ids=["pth", "safetensors"])
@pytest.mark.parametrize("keep", [0.5, 0.01])
def test_truncated_files_are_a_checkpoint_error(tmp_path, real_files, which, keep):
    good = real_files[which]
    bad = tmp_path / f"truncated{good.suffix}"
    data = good.read_bytes()
    bad.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=bad.name):
        cait.load_model(SMALL if which == 0 else None, checkpoint=bad)


@pytest.mark.parametrize(
    "content, suffix",
    [
        (os.urandom(4096), ".pth"),
        (b"\x00" * 64, ".safetensors"),
        (b"", ".pth"),
        (b"not a checkpoint at all\n", ".bin"),
    ],
)
def test_garbage_files_are_a_checkpoint_error(tmp_path, content, suffix):
    path = tmp_path / f"garbage{suffix}"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=path.name):
        cait.load_model(SMALL, checkpoint=path)
    if suffix == ".safetensors":  # a header that is not one: the same clear error from the header reader
        with pytest.raises(CheckpointError, match=path.name):
            stored_config(path)


@pytest.mark.parametrize("obj", [{"model": [1, 2, 3]}, {"a": torch.zeros(1), "b": "text"}, torch.zeros(3)])
def test_pickles_that_are_not_state_dicts(tmp_path, obj):
    path = tmp_path / "odd.pth"
    torch.save(obj, path)
    with pytest.raises(CheckpointError, match="odd.pth"):
        cait.load_model(SMALL, checkpoint=path)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        cait.load_model(SMALL, checkpoint=tmp_path / "nope.pth")
    with pytest.raises(CheckpointError, match="not found"):
        stored_config(tmp_path / "nope.safetensors")


@pytest.mark.parametrize("depth", [6, 9, 12])
def test_grow_depth_keeps_the_function_with_muted_copies(depth):
    """Growing 6 SA blocks into `depth`: every old block appears in order, each copy after the first has its
    gammas set, and with gamma 0 the deeper model computes exactly the shallow one's logits."""
    shallow = cait.load_model("cait_nano_64", weights=False).model.eval()
    state = shallow.state_dict()
    grown = grow_depth(state, depth, gamma=0.0)
    deep = cait.load_model("cait_nano_64", weights=False, depth=depth).model.eval()
    load_into(deep, grown, "grown")
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(deep(x), shallow(x), atol=1e-5)
    sources = [
        next(
            i
            for i in range(6)
            if torch.equal(grown[f"blocks.{j}.attn.qkv.weight"], state[f"blocks.{i}.attn.qkv.weight"])
        )
        for j in range(depth)
    ]
    assert sources == sorted(sources) and set(sources) == set(range(6))
    muted = [j for j in range(depth) if not grown[f"blocks.{j}.gamma_1"].any()]
    assert len(muted) == depth - 6 and all(sources[j - 1] == sources[j] for j in muted)
    with pytest.raises(CheckpointError, match="cannot grow 6 self-attention blocks into 4"):
        grow_depth(state, 4, gamma=0.0)


def test_writes_of_one_file_at_once_use_their_own_temporary_files(tmp_path):
    # A second writer of the same file (another process sharing a cache) starts while the first is mid-write:
    # with one fixed temporary name it truncates the first's file, and the first's rename then finds none.
    path = tmp_path / "shared.json"

    def first(f):
        f.write(b"first ")
        atomic_write(path, lambda g: g.write(b"second"))
        f.write(b"done")

    atomic_write(path, first)
    assert path.read_bytes() == b"first done" and [p.name for p in tmp_path.iterdir()] == ["shared.json"]

    def failing(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):  # a failed write leaves the file as it was, and no temporary file
        atomic_write(path, failing)
    assert path.read_bytes() == b"first done" and [p.name for p in tmp_path.iterdir()] == ["shared.json"]
