"""/analyze's method options against the one set of bounds in `cait.explain.attribution.OPTION_BOUNDS`: a value
outside (steps that would hold the model for minutes, zero or negative counts, a negative noise) is refused in one
line naming the option, before any forward pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app import api, session
from cait.errors import InputError
from cait.explain.attribution import OPTION_BOUNDS, MethodOptions, OptionError, checked_options

DEFAULTS = MethodOptions()
ASKED = dict(
    method="integrated_gradients",
    target=-1,
    causal=False,
    signed=False,
    ig_baseline="mean",
    rollout_head_fusion="mean",
    seed=0,
    logit_lens=False,
    patching="",
    ig_steps=DEFAULTS.ig_steps,
    smoothgrad_samples=DEFAULTS.smoothgrad_samples,
    smoothgrad_stdev=DEFAULTS.smoothgrad_stdev,
    rollout_discard_ratio=DEFAULTS.rollout_discard_ratio,
)
BAD = [
    ("ig_steps", 1000, "ig_steps must be between 4 and 128, got 1000"),
    ("ig_steps", 0, "ig_steps must be between 4 and 128, got 0"),
    ("ig_steps", -5, "ig_steps must be between 4 and 128, got -5"),
    ("ig_steps", 4.5, "ig_steps must be a whole number, got 4.5"),
    ("smoothgrad_samples", 0, "smoothgrad_samples must be between 2 and 64, got 0"),
    ("smoothgrad_samples", -3, "smoothgrad_samples must be between 2 and 64, got -3"),
    ("smoothgrad_stdev", -1, "smoothgrad_stdev must be between 0 and 1, got -1"),
    ("smoothgrad_stdev", float("nan"), "smoothgrad_stdev must be between 0 and 1, got nan"),
    ("smoothgrad_stdev", "lots", "smoothgrad_stdev must be a number, got 'lots'"),
    ("rollout_discard_ratio", 1.0, "rollout_discard_ratio must be between 0 and 0.95, got 1"),
]


@pytest.mark.parametrize("name, value, message", BAD)
def test_a_bad_option_is_refused_before_any_work_naming_it(name, value, message, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the image was analysed before the options were checked")

    monkeypatch.setattr(session, "analyse", no_work)
    with pytest.raises(OptionError) as refused:
        api.answer(None, "image.png", **{**ASKED, name: value})
    assert str(refused.value) == message and isinstance(refused.value, InputError)


def test_the_bounds_and_the_defaults():
    """Every bound is reachable and holds the default; a slider's float for a whole number is taken."""
    for name, (low, high) in OPTION_BOUNDS.items():
        assert low <= getattr(DEFAULTS, name) <= high
        assert getattr(checked_options(**{name: low}), name) == low
        assert getattr(checked_options(**{name: high}), name) == high
    assert checked_options(ig_steps=32.0, smoothgrad_samples="8").smoothgrad_samples == 8
    assert checked_options() == DEFAULTS


@pytest.mark.parametrize(
    "asked, message",
    [
        ({"seed": 2**70}, f"seed must be a whole number from -2**63 to 2**64 - 1 (torch's seeds), got {2**70}"),
        ({"seed": -(2**70)}, f"seed must be a whole number from -2**63 to 2**64 - 1 (torch's seeds), got {-(2**70)}"),
        ({"target": 10}, "target must be in 0..9 or -1, got 10"),
        ({"target": -2}, "target must be in 0..9 or -1, got -2"),
    ],
)
def test_a_bad_seed_or_target_is_refused_before_any_work(asked, message, monkeypatch):
    """Issue 59: a seed torch cannot take answered "Internal error"; a class the model lacks was refused only
    after the analysis' forward pass. Both are refused in one line before any work, as the options are."""

    def no_work(*args, **kwargs):
        raise AssertionError("the image was analysed before the call was checked")

    monkeypatch.setattr(session, "analyse", no_work)
    loaded = SimpleNamespace(cfg=SimpleNamespace(num_classes=10, grid_size=4, depth_token_only=2))
    with pytest.raises(InputError) as refused:
        api.answer(loaded, "image.png", **{**ASKED, **asked})
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "name", ["method", "ig_baseline", "rollout_head_fusion", "smoothgrad_stdev", "patching", "token_region"]
)
def test_a_refusal_cuts_the_value_it_echoes(name, monkeypatch):
    """Issue 59: a 100,000-character value was answered and logged whole. Every refusal shows at most its
    first 80 characters, as the raw-call checks do (`cait.errors.shown`)."""
    monkeypatch.setattr(session, "analyse", lambda *a, **k: pytest.fail("analysed a bad call"))
    loaded = SimpleNamespace(cfg=SimpleNamespace(num_classes=10, grid_size=4, depth_token_only=2))
    with pytest.raises(InputError) as refused:
        api.answer(loaded, "image.png", **{**ASKED, "token_region": 1, name: "x" * 100_000})
    message = str(refused.value)
    assert "'" + "x" * 76 + "..." in message and len(message) < 400, message[:400]
