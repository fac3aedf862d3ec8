"""Heat maps of the speedup map: one figure per length class, load x max batch size.

The colour scale (logarithmic, 1x to the larger of the quoted range's top and the map's
maximum, ticks labelled like the cells: 1x, 2x, 4x) is shared by every class so that
figures compare at a glance; cells whose speedup lies inside the quoted range are outlined
and hatched. Built on :class:`matplotlib.figure.Figure` like :mod:`sim.report.plots` (no
pyplot state).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

from sim.report.speedup import CLAIMED_SPEEDUP_RANGE
from sim.studies.speedup_map import BURST

_WIDTH_IN, _HEIGHT_IN, _DPI = 6.4, 4.2, 100


def speedup_heatmap(table: pd.DataFrame, length_class: str,
                    band: tuple[float, float] = CLAIMED_SPEEDUP_RANGE) -> Figure:
    """Speedup of one class as a load x batch-size heat map, annotated, quoted range outlined.

    Args:
        table: the map table (``sim.studies.speedup_map.map_table``), all classes.
        length_class: the class to draw.
        band: (low, high) speedup range to outline.

    Returns:
        A Figure with one Axes (an image, a colour bar) and one rectangle per in-range cell.
    """
    mine = table[table["length_class"] == length_class]
    loads = [BURST] + sorted(x for x in mine["load"].unique() if x != BURST)
    sizes = sorted(mine["max_batch_size"].unique())
    cells = mine.set_index(["load", "max_batch_size"])
    grid = np.array([[float(cells.loc[(load, b), "speedup"]) for b in sizes] for load in loads])
    spread = np.array([[float(cells.loc[(load, b), "speedup_spread"]) for b in sizes] for load in loads])
    top = max(band[1], float(np.nanmax(table["speedup"])))
    fig = Figure(figsize=(_WIDTH_IN, _HEIGHT_IN), dpi=_DPI, layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="viridis", norm=LogNorm(vmin=1.0, vmax=top), aspect="auto")
    bar = fig.colorbar(image, ax=ax, label="speedup (static / continuous mean E2E)")
    # A log axis labels its ticks 2x10^0 by default; state them as the cells do.
    bar.ax.yaxis.set_major_locator(FixedLocator(colorbar_ticks(top)))
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}x"))
    bar.ax.yaxis.set_minor_locator(NullLocator())
    for (i, j), value in np.ndenumerate(grid):
        _annotate(ax, i, j, float(value), float(spread[i, j]), band)
    ax.set_xticks(range(len(sizes)), [str(b) for b in sizes])
    ax.set_yticks(range(len(loads)), [_label(x) for x in loads])
    ax.set(xlabel="max batch size", ylabel="load",
           title=f"{length_class}: continuous vs static (hatched: inside quoted {band[0]:g}x-{band[1]:g}x)")
    return fig


def colorbar_ticks(top: float) -> list[float]:
    """Speedups to mark on a 1x-to-``top`` log scale: the doublings 1, 2, 4, ..., or where
    fewer than three fit, evenly spaced round values (1, 1.5, 2, 2.5 up to 2.9x)."""
    doublings = [2.0**k for k in range(int(np.log2(max(top, 1.0))) + 1)]
    if len(doublings) >= 3:
        return doublings
    even = MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(1.0, top)
    return [round(float(t), 9) for t in even if 1.0 <= t <= top * (1 + 1e-9)]


def _annotate(ax: Axes, row: int, col: int, value: float, spread: float, band: tuple[float, float]) -> None:
    inside = band[0] <= value <= band[1]
    if inside:  # outline and hatch, so the band reads without colour too
        ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="white",
                               hatch="//", linewidth=2.5, gid="in-band"))
    ax.text(col, row, f"{value:.2f}x\n±{spread:.0%}", ha="center", va="center", fontsize=9,
            color="black" if value > 3.0 else "white", fontweight="bold" if inside else "normal")


def _label(load: object) -> str:
    return "burst (offline)" if load == BURST else f"{float(load):g} x capacity"  # type: ignore[arg-type]
