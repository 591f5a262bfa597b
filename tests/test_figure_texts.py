"""Every plotly figure the app draws (`cait.figures`, `app.figures`, the atlas page's), read as the browser gets it:
hover texts formatted (no 17-digit floats, only format specifiers plotly's d3-format takes), every heatmap with
both axis titles, a legend below a plot never on its axis title, a colour bar with room, one colour convention
(red for the class, blue against it), the lens title's grammar."""

from __future__ import annotations

import re

import numpy as np
import plotly.colors
import pytest
import torch
from PIL import Image

from app import figures as app_figures
from cait.atlas.page import class_dla_figure, distributions, token_patching_plotly
from cait.figures import distance_plot, residual_ratio_plot, to_plotly
from cait.figures.causal import head_attribution_plotly, knockout_plotly, logit_parts_plotly
from cait.figures.colours import LEGEND_GAP
from cait.figures.compare import cka_plotly, head_differences_plotly, head_similarity_plotly
from cait.figures.mechanisms import heads_plotly, lens_plotly, patching_plotly

RNG = np.random.default_rng(0)
DEPTH, CA = 3, 2
# d3-format: [[fill]align][sign][symbol][0][width][,][.precision][~][type]
D3_FORMAT = re.compile(r"^(?:.?[<>=^])?[-+( ]?[$#]?0?\d*,?(?:\.\d+)?~?[efgrsdpoxXbc%]?$")


def plotly_takes(spec: str) -> bool:
    """Whether plotly.js applies the d3 format `spec`: its `Lib.adjustFormat` prefixes "~" to a spec that does not
    start with one of "~,.0$" and names a type among "&fps" ("+.3f" becomes "~+.3f", which d3 refuses: the hover
    then shows the raw number)."""
    adjusted = "~" + spec if not re.match(r"[~,.0$]", spec) and re.search(r"[&fps]", spec) else spec
    return bool(D3_FORMAT.match(adjusted))


RAW_FLOAT = re.compile(r"\d\.\d{7,}")  # a number printed with more digits than anyone reads


def _view() -> Image.Image:
    return Image.fromarray(RNG.integers(0, 255, (32, 32, 3), dtype=np.uint8))


def every_figure() -> dict:
    """One of each plotly figure, on random numbers (with awkward digits)."""
    heat = RNG.normal(size=(4, 4))
    tile = Image.new("RGB", (64, 64))
    heads = RNG.normal(size=(CA, 3)) / 3
    blocks = DEPTH + CA
    hist = {"entropy": {"edges": np.linspace(0.1234567891, 2.987654321, 31).tolist(), "counts": [[[1] * 30] * 3] * 2}}
    tokens = {
        "top": 3,
        "best": {"restored": 0.1234567891, "restored_ci95": [0.1, 0.15]},
        "top_together": {"restored": 0.3333333333, "restored_ci95": [0.3, 0.37]},
        "best_in_box": {"mean": 0.5},
    }
    return {
        "enlarged": app_figures.enlarged_figure(tile, _view(), heat, cmap="inferno", title="t"),
        "enlarged signed": app_figures.enlarged_figure(tile, _view(), heat, cmap="RdBu_r", title="t", signed=True),
        "mixing": app_figures.mixing_figure(RNG.normal(size=(3, 3)), RNG.normal(size=(3, 3)), 0),
        "head stats": app_figures.head_stats_figure(
            RNG.random((CA, 3)), {"after_proj_l": RNG.random((DEPTH, 3)) * 9}, patches=16, uniform_distance=5.123456789
        ),
        "knockout": knockout_plotly(RNG.normal(size=blocks), RNG.random(blocks), depth=DEPTH, ca_depth=CA),
        "head attribution": head_attribution_plotly(heads, [("a", 0.123456789), ("b", -1.23456789)], title="t"),
        "head attribution with removal": head_attribution_plotly(heads, [("a", 0.5)], title="t", removal=heads / 2),
        "logit parts": logit_parts_plotly([("a", 0.123456789), ("b", -1.23456789)]),
        "lens": lens_plotly(
            [0.1234567891, 0.5, 0.9], ["Bag", "Coat", "Coat"], [0.4, 0.5, 0.9], target="Coat", forms_at=1
        ),
        "patching": patching_plotly(
            RNG.normal(size=(blocks, 2)),
            1.23456789,
            class_token=RNG.normal(size=CA - 1),
            depth=DEPTH,
            ca_depth=CA,
            title="t",
        ),
        "patching heads": heads_plotly(heads, 1.23456789, title="t"),
        "distance": to_plotly(distance_plot(torch.rand(DEPTH, 3) * 9, 5.123456789, images=4)),
        "residual ratios": to_plotly(residual_ratio_plot({"sa": [0.1234567891] * DEPTH, "ca": [0.2] * CA})),
        "class DLA": class_dla_figure(RNG.normal(size=(4, 3)), ["CA1 head 1", "a", "b", "c"], ["x", "y", "z"]),
        "class DLA with counts": class_dla_figure(
            RNG.normal(size=(4, 3)), list("abcd"), list("xyz"), counts=[1, 2, 3], half=RNG.random((4, 3))
        ),
        "distributions": distributions(hist, CA, 3)[0],
        "token patching": token_patching_plotly(tokens, "noise at severity 3"),
        "compare CKA": cka_plotly(RNG.random((blocks, 4)), *_compare_blocks(), names=("a", "b")),
        "compare heads": head_similarity_plotly(
            RNG.uniform(-1, 1, (4, 3)),
            [(1, 1), (1, 2), (2, 1), (2, 2)],
            [(1, 1), (1, 2), (2, 1)],
            [((1, 1), (1, 2), 0.5)],
        ),
        "compare head differences": head_differences_plotly(
            [
                {
                    "head_a": "ca1_head1",
                    "head_b": "ca1_head2",
                    "dla_difference": 0.123456789,
                    "dla_ci_low": 0.1,
                    "dla_ci_high": 0.15,
                }
            ],
            ["dla"],
            {"dla": "direct logit attribution"},
        ),
    }


def _compare_blocks() -> tuple[list[str], list[str]]:
    """Block names of two models as a comparison names them: DEPTH SA + CA blocks, and 2 + 2."""
    a = [f"blocks.{k}" for k in range(DEPTH)] + [f"blocks_token_only.{c}" for c in range(CA)]
    return a, ["blocks.0", "blocks.1", "blocks_token_only.0", "blocks_token_only.1"]


FIGURES = every_figure()


def test_plotly_takes_what_its_adjust_format_leaves_valid():
    assert plotly_takes(".3f") and plotly_takes(".0%") and plotly_takes(",.2f") and not plotly_takes("+.3f")


@pytest.mark.parametrize("name", list(FIGURES))
def test_hover_texts_are_formatted(name):
    for trace in FIGURES[name].data:
        if trace.type == "image" or trace.hoverinfo == "skip":
            continue
        template = trace.hovertemplate
        if template is None:  # hover text written by the builder, shown as it is
            assert trace.hoverinfo == "text", f"{name}: a {trace.type} trace shows plotly's raw numbers on hover"
            texts = trace.hovertext if isinstance(trace.hovertext, (list, tuple)) else [trace.hovertext]
            assert not any(RAW_FLOAT.search(str(t)) for t in texts), f"{name}: {texts}"
            continue
        for field, spec in re.findall(r"%\{([^}:]+)(?::([^}]*))?\}", str(template)):
            if field.split("[")[0] in ("x", "y", "z", "delta", "final", "customdata") and spec == "":
                numeric = field.split("[")[0] in ("z", "delta", "final", "customdata") or _numbers(trace, field)
                assert not numeric, f"{name}: %{{{field}}} without a format in {template!r}"
            assert plotly_takes(spec), f"{name}: plotly rejects the format {spec!r} in {template!r}"


def _numbers(trace, field: str) -> bool:
    values = getattr(trace, field, None)
    return values is not None and any(isinstance(v, float) and not float(v).is_integer() for v in np.ravel(values))


def _axis(fig, trace, letter: str):
    ref = getattr(trace, f"{letter}axis") or letter
    return fig.layout[f"{letter}axis{ref[1:]}"]


@pytest.mark.parametrize("name", [n for n, f in FIGURES.items() if any(t.type == "heatmap" for t in f.data)])
def test_every_heatmap_has_both_axis_titles(name):
    fig = FIGURES[name]
    for trace in (t for t in fig.data if t.type == "heatmap"):
        for letter in "xy":
            assert _axis(fig, trace, letter).title.text, f"{name}: the heatmap's {letter} axis has no title"


def _plot_height(fig) -> float:
    margin = fig.layout.margin
    return fig.layout.height - (margin.t if margin.t is not None else 100) - (margin.b if margin.b is not None else 80)


@pytest.mark.parametrize("name", list(FIGURES))
def test_a_legend_below_the_plot_sits_under_the_axis_title(name):
    fig = FIGURES[name]
    legend = fig.layout.legend
    named = [t for t in fig.data if t.type not in ("image", "heatmap") and t.showlegend is not False]
    shown = len(named) > 1 and fig.layout.showlegend is not False
    if not shown or legend.orientation != "h":
        return
    below = -legend.y * _plot_height(fig) if legend.yanchor == "top" else None
    assert below is not None and below >= LEGEND_GAP - 0.5, f"{name}: the legend starts {below} px under the plot"
    assert fig.layout.margin.b >= LEGEND_GAP + 30, f"{name}: no room for the legend in the bottom margin"


@pytest.mark.parametrize("name", [n for n, f in FIGURES.items() if any(t.type == "heatmap" for t in f.data)])
def test_a_colour_bar_has_room(name):
    assert _plot_height(FIGURES[name]) >= 180, f"{name}: the colour bar spans {_plot_height(FIGURES[name])} px"


def _colour_at(trace, z: float) -> tuple[int, int, int]:
    """The colour `trace` (a heatmap) gives the value z, as the browser resolves its scale."""
    scale = [[float(s), c] for s, c in trace.colorscale]
    if trace.reversescale:
        scale = [[1 - s, c] for s, c in reversed(scale)]
    t = (z - trace.zmin) / (trace.zmax - trace.zmin)
    chosen = scale[-1][1] if t >= 0.5 else scale[0][1]
    return plotly.colors.unlabel_rgb(plotly.colors.convert_colors_to_same_type(chosen, "rgb")[0][0])


@pytest.mark.parametrize("name", ["class DLA", "class DLA with counts", "patching heads", "mixing", "enlarged signed"])
def test_positive_values_are_red_and_negative_blue(name):
    """Issue 49 N39: "for the class" is red everywhere (the Dataset heatmap drew it blue)."""
    trace = next(t for t in FIGURES[name].data if t.type == "heatmap")
    assert trace.zmid == 0 and trace.zmin == -trace.zmax
    red, _, blue = _colour_at(trace, trace.zmax)
    assert red > blue + 60, f"{name}: the largest value is drawn {red, blue}"
    red, _, blue = _colour_at(trace, trace.zmin)
    assert blue > red + 60, f"{name}: the smallest value is drawn {red, blue}"


def test_the_waterfall_is_red_for_the_class_and_blue_against_it():
    waterfall = FIGURES["logit parts"].data[0]
    up, down = (plotly.colors.hex_to_rgb(m.marker.color) for m in (waterfall.increasing, waterfall.decreasing))
    assert up[0] > up[2] and down[2] > down[0]


def test_the_lens_title_reads_as_a_sentence():
    """Issue 49 N45: 'forms the patch embedding' (forms_at = 0) was no sentence."""
    title = lens_plotly([0.9, 0.9], ["Coat", "Coat"], [0.9, 0.9], target="Coat", forms_at=0).layout.title.text
    assert "forms at the patch embedding" in title
    title = lens_plotly([0.1, 0.9], ["Bag", "Coat"], [0.5, 0.9], target="Coat", forms_at=1).layout.title.text
    assert "forms after SA block 1" in title


@pytest.mark.parametrize("gap", [2.0, -1.5, 0.6])
def test_the_heads_grid_gives_shares_and_intervals_only_for_a_gap_large_enough(gap):
    """Issue 49 N38: shares of a gap under one logit swing without bound, so the grid gives Δlogits there; over
    a dataset each share carries its 95% interval under it."""
    from cait.figures.mechanisms import MEANINGFUL_GAP, heads_plotly

    heads = np.array([[0.5, -0.25], [1.0, 0.0]])
    ci95 = np.array([[[0.1, 0.4], [-0.2, 0.0]], [[0.3, 0.7], [-0.1, 0.1]]])
    text = [cell for row in heads_plotly(heads, gap, title="t", ci95=ci95).data[0].text for cell in row]
    if abs(gap) >= MEANINGFUL_GAP:
        assert text[0] == f"{0.5 / gap:.0%}<br>[10%, 40%]" and all("<br>[" in cell for cell in text)
    else:
        assert text == ["+0.50", "-0.25", "+1.00", "+0.00"]
