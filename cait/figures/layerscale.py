"""LayerScale and residual-branch figures on one depth axis: SA blocks SA1..SAD, a gap, then CA1, CA2."""

from __future__ import annotations

from .lines import LinePlot, Series

BRANCH = {"gamma_1": "gamma_1 (attention branch)", "gamma_2": "gamma_2 (FFN branch)"}
STAGE_COLOUR = {"sa": "#1f77b4", "ca": "#d62728"}


def block_position(stage: str, layer: int, depth: int) -> int:
    """x of block `layer` (0-based within its stage): SA blocks at 1..depth, CA blocks after a gap of one."""
    return layer + 1 if stage == "sa" else depth + 2 + layer


def block_ticks(depth: int, ca_depth: int) -> tuple[list[float], list[str]]:
    positions = [block_position("sa", i, depth) for i in range(depth)] + [
        block_position("ca", i, depth) for i in range(ca_depth)
    ]
    return positions, [f"SA{i + 1}" for i in range(depth)] + [f"CA{i + 1}" for i in range(ca_depth)]


def _depths(rows: list[dict]) -> tuple[int, int]:
    count = lambda stage: 1 + max((r["layer"] for r in rows if r["stage"] == stage), default=-1)
    return count("sa"), count("ca")


def layerscale_plot(rows: list[dict], *, init_values: float | None) -> LinePlot:
    """|gamma| per depth from `cait.explain.layerscale.layerscale_stats` rows: one panel per branch, the median over
    channels with its p10-p90 band (mean on hover), SA and CA blocks in two colours, the init eps dashed."""
    depth, ca_depth = _depths(rows)
    series = []
    for panel, gamma in enumerate(BRANCH):
        for stage, colour in STAGE_COLOUR.items():
            sel = sorted((r for r in rows if r["gamma"] == gamma and r["stage"] == stage), key=lambda r: r["layer"])
            if not sel:
                continue
            series.append(
                Series(
                    f"{stage.upper()} blocks: median, band p10-p90",
                    [block_position(stage, r["layer"], depth) for r in sel],
                    [r["median"] for r in sel],
                    panel=panel,
                    colour=colour,
                    legend=panel == 0,
                    band=([r["p10"] for r in sel], [r["p90"] for r in sel]),
                    hover=[f"mean {r['mean']:.3g}, p10 {r['p10']:.3g}, p90 {r['p90']:.3g}" for r in sel],
                )
            )
    return LinePlot(
        title="LayerScale |gamma| per depth (median over channels, band p10-p90)",
        panels=list(BRANCH.values()),
        x_label="block",
        y_label="|gamma| over channels",
        series=series,
        log_y=True,
        x_ticks=block_ticks(depth, ca_depth),
        hlines=[(init_values, f"init eps = {init_values:g}")] if init_values is not None else [],
    )


def layerscale_epochs_plot(rows: list[dict], *, init_values: float | None) -> LinePlot:
    """Median |gamma| per depth, one line per epoch (rows with an "epoch" column, from
    `layerscale_stats_from_metrics`), later epochs darker."""
    import matplotlib

    depth, ca_depth = _depths(rows)
    epochs = sorted({r["epoch"] for r in rows})
    blues = matplotlib.colormaps["Blues"]
    series = []
    for panel, gamma in enumerate(BRANCH):
        for i, epoch in enumerate(epochs):
            sel = sorted(
                (r for r in rows if r["gamma"] == gamma and r["epoch"] == epoch),
                key=lambda r: block_position(r["stage"], r["layer"], depth),
            )
            colour = matplotlib.colors.to_hex(blues(0.25 + 0.75 * (i + 1) / len(epochs)))
            series.append(
                Series(
                    f"epoch {epoch}",
                    [block_position(r["stage"], r["layer"], depth) for r in sel],
                    [r["median"] for r in sel],
                    panel=panel,
                    colour=colour,
                    legend=panel == 0 and i in (0, len(epochs) - 1),
                )
            )  # first and last named
    return LinePlot(
        title=f"LayerScale across training, epochs {epochs[0]}-{epochs[-1]} (darker = later)",
        panels=[f"{b}: median over channels" for b in BRANCH.values()],
        x_label="block",
        y_label="median |gamma|",
        series=series,
        log_y=True,
        x_ticks=block_ticks(depth, ca_depth),
        hlines=[(init_values, f"init eps = {init_values:g}")] if init_values is not None else [],
        height=520,
    )


def residual_ratio_plot(ratios: dict[str, list[float]]) -> LinePlot:
    """||gamma * branch(x)|| / ||x|| per block for one image ("sa", "ffn", "ca", "ca_ffn" lists)."""
    depth, ca_depth = len(ratios.get("sa", [])), len(ratios.get("ca", []))
    labels = {"sa": "SA attention", "ffn": "SA FFN", "ca": "CA attention", "ca_ffn": "CA FFN"}
    series = [
        Series(
            label,
            [block_position("ca" if key.startswith("ca") else "sa", i, depth) for i in range(len(v))],
            list(v),
            dash="solid" if key in ("sa", "ca") else "dot",
            colour=STAGE_COLOUR["ca" if key.startswith("ca") else "sa"],
        )
        for key, label in labels.items()
        if (v := ratios.get(key))
    ]
    return LinePlot(
        title="Residual-branch ratio for this image: ||branch|| / ||residual input||",
        panels=[""],
        x_label="block",
        y_label="ratio",
        series=series,
        log_y=True,
        x_ticks=block_ticks(depth, ca_depth),
        height=380,
    )
