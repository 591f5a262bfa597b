"""One way to ask for an image set: every command declares --data/--boxes/--limit/--sample through
`cait.flags.add_data_flags` and reads them through `cait.data.read_from_flags`; the atlas's library entry takes
`AtlasOptions`, recorded in atlas_args.json exactly as the command line's flags were (so older atlases resume)."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

from cait.atlas.__main__ import parse_args
from cait.atlas.options import AtlasOptions
from cait.atlas.run import FREE_ARGS, recorded_args
from cait.atlas.shards import FORMAT

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("cait", "analysis", "app", "scripts", "benchmarks")
IMAGE_SET_FLAG = re.compile(r"""add_argument\(\s*(?:f?"[^"]*",\s*)*"--(data|boxes|sample)\"""")
# --data that names a training set (`cait.data.build_dataset`), not an image set the reader reads
TRAINING_DATA = {"cait/train/args.py", "analysis/_common.py", "scripts/calibrate_head.py"}
TRAINING_DATA |= {"benchmarks/corruption_cost.py"}


def _sources() -> dict[str, str]:
    found = {}
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            found[path.relative_to(REPO).as_posix()] = path.read_text()
    return found


def test_image_set_flags_are_declared_once_and_read_once():
    """No parser but `add_data_flags` declares --data, --boxes or --sample (training sets aside, and the
    shared training-budget flags of analysis/_common.py), and nothing reads args.data with read_images."""
    declared = {}
    for name, text in _sources().items():
        hits = [m.group(1) for m in IMAGE_SET_FLAG.finditer(text)]
        if name == "cait/flags.py" or not hits:
            continue
        if name in TRAINING_DATA and hits == ["data"]:
            continue
        declared[name] = hits
    assert declared == {}
    readers = {n for n, t in _sources().items() if re.search(r"read_images\(\s*args\.data", t)}
    assert readers == {"cait/data/reader.py"}  # read_from_flags itself
    # and the commands that read an image set do call the one function
    for name in ("cait/atlas/__main__.py", "cait/evaluate/__main__.py", "cait/compare/__main__.py"):
        assert "add_data_flags(" in _sources()[name], name
    for name in ("analysis/_common.py", "analysis/compare_models.py", "analysis/mechanisms.py"):
        assert "add_data_flags(" in _sources()[name], name


def _recorded_as_before(args) -> dict:
    """atlas_args.json's rule before AtlasOptions: every parsed flag but the free ones, in JSON's types."""
    kept = {k: v for k, v in sorted(vars(args).items()) if k not in FREE_ARGS}
    return json.loads(json.dumps({"format": FORMAT, **kept}))


def test_options_are_the_flags_and_record_the_same_arguments():
    argv = ["--data", "imgs", "--out", "o", "--boxes", "b.json", "--limit", "7", "--sample", "first"]
    argv += ["--model", "cait_nano_28", "--knockouts", "--patching", "gaussian_noise:3", "--precision", "bf16"]
    for flags in (argv, ["--data", "fashion-mnist-scenes", "--out", "o"]):
        args = parse_args(flags)
        assert {f.name for f in fields(AtlasOptions)} == set(vars(args))
        assert recorded_args(AtlasOptions.from_flags(args)) == _recorded_as_before(args)
    # every field has its comment: what it is, for a caller who builds the options in Python
    source = (REPO / "cait" / "atlas" / "options.py").read_text()
    for field in fields(AtlasOptions):
        assert re.search(rf"^    {field.name}: [^\n]+  # \S", source, re.M), field.name


def test_the_apps_options_record_what_its_flags_did(tmp_path):
    """The Dataset tab used to build `python -m cait.atlas` flags; its options must record the same, so that the
    atlases it built before still match and resume."""
    from app import dataset_view as dv
    from app.models import ModelChoice
    from app.tabs.dataset import scenes_options

    choices = [ModelChoice("cait_nano_28"), ModelChoice(None, "w.safetensors"), ModelChoice("cait_xxs24_224")]
    choices += [ModelChoice("cait_xxs24_224", download=True), ModelChoice("cait_micro_136", random_init=True)]
    for choice in choices:
        out = tmp_path / "built"
        old = ["--data", dv.SCENES, "--limit", "50", "--out", str(out), "--workers", "0", "--device", "cpu"]
        old += ["--shard-size", str(dv.BUILT_SHARD)]
        old += ["--model", choice.name] if choice.name else []
        old += ["--checkpoint", choice.checkpoint] if choice.checkpoint else []
        old += ["--pretrained"] * choice.download + ["--random-init"] * choice.random_init
        options = scenes_options(choice, 50, out, "cpu")
        assert options == AtlasOptions.from_flags(parse_args(old))
        assert recorded_args(options) == _recorded_as_before(parse_args(old))
