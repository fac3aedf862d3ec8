"""``results/speedup_map.md``: the map, static's capacity, the article's table and the verdict.

Everything here is a pure function of a :class:`sim.studies.speedup_map.SpeedupMap`; every
number in the prose is computed from its tables, so the text cannot go stale when the model
or the map changes. The explanation rests on two computable quantities:

* the **wasted-slot share** of a static batch of B requests, 1 - mean / E[max of B] (the
  slots that idle while the batch's longest sequence finishes), computed exactly for the
  uniform length distributions of the seed table; offline, continuous batching's gain is
  about 1 / (1 - waste);
* **load**: open-loop arrivals queue behind static's slower service; near static's capacity
  the queueing delay, not the decode time, dominates its latency.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.report.speedup import CLAIMED_SPEEDUP_RANGE
from sim.report.tables import markdown_table
from sim.studies.speedup_map import BURST, SpeedupMap

ARTICLE_SPEEDUPS: dict[str, float] = {"short": 2.7, "medium": 4.0, "long": 6.7, "mixed": 5.4}
"""The often-quoted per-class speedups (short < 100 tokens, 100-500, > 1000, mixed)."""

ARTICLE_BATCH_SIZE = 16
"""Deployment of the article table: the seed table's (and quickstart's) max batch size."""

ARTICLE_LOAD = 0.9
"""Load of the article table: the busiest map load below static's capacity, where one would run it."""

LENGTH_ORDER = ("short", "medium", "long")
"""Classes ordered by output length, for "the longer the output, the larger the gain"."""


def expected_max_uniform(low: int, high: int, batch_size: int) -> float:
    """E[max of ``batch_size`` iid integers uniform on low..high] = low + sum_k P(max > k)."""
    k = np.arange(low, high)
    below = (k - low + 1) / (high - low + 1)
    return float(low + np.sum(1.0 - below**batch_size))


def wasted_share(low: int, high: int, batch_size: int) -> float:
    """Share of static's decode slots idle while each batch waits for its longest sequence."""
    return 1.0 - (low + high) / 2.0 / expected_max_uniform(low, high, batch_size)


def map_markdown(speedup_map: SpeedupMap, band: tuple[float, float] = CLAIMED_SPEEDUP_RANGE) -> str:
    """The whole ``speedup_map.md``.

    Args:
        speedup_map: the measured map.
        band: the quoted speedup range marked in the map.

    Returns:
        Markdown ending with a newline; identical maps give identical text.
    """
    parts = [
        "# Static vs continuous batching: the speedup map\n",
        _setup(speedup_map),
        "## Speedup per length class, load and max batch size\n",
        _grid(speedup_map, band),
        _band_text(speedup_map, band),
        "## The quoted table, in its own form\n",
        article_markdown(speedup_map),
        "## \"The longer the output, the larger the gain\"\n",
        verdict_markdown(speedup_map),
        "## Static's capacity\n",
        _capacity(speedup_map),
        "## Precision\n",
        _precision(speedup_map),
    ]
    return "\n".join(parts)


def _setup(m: SpeedupMap) -> str:
    cfg = m.config
    classes = "; ".join(f"{name}: {m.lengths_text(name)}" for name in cfg.classes)
    loads = ", ".join(f"{f:g}" for f in cfg.loads)
    return (
        f"{m.deployment}. Output-length classes ({classes}). Both policies use the same "
        f"`max_batch_size` ({', '.join(str(b) for b in cfg.batch_sizes)}) and serve the same request "
        f"stream (same seed). Each run has {cfg.batches_per_run} x max batch size requests; every "
        f"number is the mean over seeds {', '.join(str(s) for s in cfg.seeds)}. *Load* is either "
        f"`burst` (every request queued at t = 0, offline) or Poisson arrivals at {loads} x static's "
        "measured capacity for that class and batch size (below). *Speedup* = static mean E2E / "
        "continuous mean E2E; *throughput gain* = continuous output tok/s / static output tok/s. "
        "Data: `speedup_map.csv` (one row per cell, with p50s, throughputs, the rate run, capacity "
        "and seed-to-seed spread); heat maps: `speedup_map_<class>.png`.\n"
    )


def _load_label(load: object) -> str:
    return "burst" if load == BURST else f"{float(load):g} x cap"  # type: ignore[arg-type]


def _grid(m: SpeedupMap, band: tuple[float, float]) -> str:
    sizes = list(m.config.batch_sizes)
    headers = ["class", "load"] + [f"B = {b}" for b in sizes]
    cells = m.table.set_index(["length_class", "load", "max_batch_size"])
    rows = []
    for name in m.config.classes:
        for load in (BURST, *m.config.loads):
            rows.append([name, _load_label(load)] + [_cell(cells.loc[(name, load, b)], band) for b in sizes])
    note = (
        f"Cells in **bold** lie inside the quoted {band[0]:g}x-{band[1]:g}x range; ± is the "
        "seed-to-seed spread of the speedup, (max - min) / mean.\n"
    )
    return markdown_table(headers, rows, [False, False] + [True] * len(sizes)) + "\n" + note


def _cell(row: pd.Series, band: tuple[float, float]) -> str:
    text = f"{row['speedup']:.2f}x"
    if in_band(float(row["speedup"]), band):
        text = f"**{text}**"
    return f"{text} ±{row['speedup_spread']:.0%}"


def in_band(value: float, band: tuple[float, float]) -> bool:
    """Whether a speedup lies inside the quoted range (inclusive)."""
    return band[0] <= value <= band[1]


def _band_text(m: SpeedupMap, band: tuple[float, float]) -> str:
    table = m.table
    inside = table[table["speedup"].between(*band)]
    burst = table[table["load"] == BURST]
    parts = [
        f"Across the {len(table)} cells the speedup ranges from {table['speedup'].min():.2f}x to "
        f"{table['speedup'].max():.2f}x; {len(inside)} lie inside {band[0]:g}x-{band[1]:g}x. "
        f"Offline (burst) it is {burst['speedup'].min():.2f}x-{burst['speedup'].max():.2f}x, "
        f"{int(burst['speedup'].between(*band).sum())} of {len(burst)} cells in the range."
    ]
    for name in m.config.classes:
        mine = table[table["length_class"] == name]
        best = mine.loc[mine["speedup"].idxmax()]
        where = _where(inside[inside["length_class"] == name])
        parts.append(
            f"**{name}**: {mine['speedup'].min():.2f}x-{mine['speedup'].max():.2f}x (highest at "
            f"{_load_label(best['load'])}, B = {int(best['max_batch_size'])}); in the range: {where}."
        )
    return "\n".join(f"- {p}" if i else p + "\n" for i, p in enumerate(parts)) + "\n"


def _where(cells: pd.DataFrame) -> str:
    if cells.empty:
        return "nowhere"
    return ", ".join(f"{_load_label(r.load)} B = {int(r.max_batch_size)}" for r in cells.itertuples(index=False))


# --------------------------------------------------------------------------- article table
def article_table(m: SpeedupMap, batch_size: int = ARTICLE_BATCH_SIZE, load: float = ARTICLE_LOAD) -> pd.DataFrame:
    """ms per request, static vs continuous, per length class, at one (batch size, load) of the map."""
    cells = m.table[(m.table["max_batch_size"] == batch_size) & (m.table["load"] == load)]
    cells = cells.set_index("length_class").loc[list(m.config.classes)]
    return pd.DataFrame({
        "length_class": cells.index,
        "static_ms": cells["static_e2e_mean_s"].to_numpy() * 1000.0,
        "continuous_ms": cells["continuous_e2e_mean_s"].to_numpy() * 1000.0,
        "speedup": cells["speedup"].to_numpy(),
        "article_speedup": [ARTICLE_SPEEDUPS.get(c, np.nan) for c in cells.index],
        "throughput_gain": cells["throughput_gain"].to_numpy(),
    })  # fmt: skip


def article_point(m: SpeedupMap) -> tuple[int, float]:
    """(batch size, load) of the article table: the stated ones, or the nearest the map has."""
    sizes, loads = m.config.batch_sizes, m.config.loads
    batch_size = min(sizes, key=lambda b: (abs(b - ARTICLE_BATCH_SIZE), b))
    return batch_size, min(loads, key=lambda f: (abs(f - ARTICLE_LOAD), f))


def article_markdown(m: SpeedupMap) -> str:
    """The article's table with measured numbers next to its claims, and when its range appears."""
    batch_size, load = article_point(m)
    table = article_table(m, batch_size, load)
    headers = ["class", "static (ms/request)", "continuous (ms/request)", "measured speedup", "quoted speedup"]
    rows = [[r.length_class, f"{r.static_ms:.0f}", f"{r.continuous_ms:.0f}", f"{r.speedup:.2f}x",
             f"{r.article_speedup:.1f}x"] for r in table.itertuples(index=False)]  # fmt: skip
    intro = (
        f"The quoted table names no deployment or load. Here: max batch {batch_size} (the seed table's), "
        f"Poisson arrivals at {load:g} x static's capacity — the busiest load of the map at which static "
        "still meets its SLO, i.e. where one would actually run it. *ms per request* = mean E2E latency.\n"
    )
    grid = markdown_table(headers, rows, [False, True, True, True, True])
    return intro + "\n" + grid + "\n" + _article_verdict(m, table)


def _article_verdict(m: SpeedupMap, table: pd.DataFrame) -> str:
    low, high = min(ARTICLE_SPEEDUPS.values()), max(ARTICLE_SPEEDUPS.values())
    near = table[table["speedup"].between(low, high)]
    cells = m.table
    band_loads = sorted({_load_label(x) for x in cells[cells["speedup"].between(low, high)]["load"]})
    ratio = (table["speedup"] / table["article_speedup"]).to_numpy()
    return (
        f"At this point {len(near)} of {len(table)} classes reach the quoted {low:g}x-{high:g}x and the "
        f"measured speedup is {ratio.min():.2f}-{ratio.max():.2f} of the quoted one. Over the whole map the "
        f"quoted range is produced only at {', '.join(band_loads) or 'no load'} (open-loop load at or beyond "
        "static's capacity, where its queue grows); offline or at light load the gain is the wasted-slot "
        "share alone and stays below it. Nor does the measured order follow the quoted one "
        f"(short {ARTICLE_SPEEDUPS['short']:g}x < medium < long {ARTICLE_SPEEDUPS['long']:g}x): "
        f"measured, {_order_text(table.set_index('length_class')['speedup'])}.\n"
    )


def _order_text(speedups: pd.Series) -> str:
    ordered = speedups.sort_values()
    return " < ".join(f"{name} {value:.2f}x" for name, value in ordered.items())


# --------------------------------------------------------------------------- verdict
def length_order(m: SpeedupMap) -> pd.DataFrame:
    """Per (load, batch size): the speedups by output length and whether gain grows with length.

    Uses the classes of ``LENGTH_ORDER`` the map has (at least two, else an empty frame).
    ``verdict`` is ``holds`` (strictly increasing with length), ``reversed`` (strictly
    decreasing) or ``mixed``; ``long_vs_short`` is the longest class's speedup / the shortest's.
    """
    present = [c for c in LENGTH_ORDER if c in m.config.classes]
    if len(present) < 2:
        return pd.DataFrame()
    table = m.table[m.table["length_class"].isin(present)]
    wide = table.pivot_table(index=["load", "max_batch_size"], columns="length_class", values="speedup",
                             sort=False)  # fmt: skip
    rows = []
    for (load, batch), values in wide.iterrows():
        steps = np.diff([float(values[c]) for c in present])
        verdict = "holds" if (steps > 0).all() else "reversed" if (steps < 0).all() else "mixed"
        rows.append({"load": load, "max_batch_size": batch, **{c: float(values[c]) for c in present},
                     "long_vs_short": float(values[present[-1]] / values[present[0]]), "verdict": verdict})  # fmt: skip
    return pd.DataFrame(rows)


def verdict_markdown(m: SpeedupMap) -> str:
    """Where "the longer the output, the larger the gain" holds and where it is reversed, and why."""
    order = length_order(m)
    if order.empty:
        return "The map has too few of the short, medium and long classes to compare.\n"
    present = [c for c in LENGTH_ORDER if c in order.columns]
    headers = ["load", "B", *present, f"{present[-1]} / {present[0]}", "verdict"]
    rows = [[_load_label(r["load"]), str(int(r["max_batch_size"])), *(f"{r[c]:.2f}x" for c in present),
             f"{r['long_vs_short']:.2f}", r["verdict"]] for _, r in order.iterrows()]  # fmt: skip
    table = markdown_table(headers, rows, [False] + [True] * (len(present) + 2) + [False])
    return _verdict_summary(order) + "\n" + table + "\n" + _waste_text(m) + "\n" + _load_text(m)


def _verdict_summary(order: pd.DataFrame) -> str:
    def cells(mask: pd.Series) -> str:
        picked = order[mask]
        return ", ".join(f"{_load_label(r.load)} B = {int(r.max_batch_size)}"
                         for r in picked.itertuples(index=False)) or "nowhere"  # fmt: skip

    longer = order["long_vs_short"] > 1
    return (
        f"Comparing short, medium and long outputs cell by cell ({len(order)} load x batch cells), the "
        f"gain grows with output length in {int((order['verdict'] == 'holds').sum())}: "
        f"{cells(order['verdict'] == 'holds')}. It is reversed (short gains most) in "
        f"{int((order['verdict'] == 'reversed').sum())}: {cells(order['verdict'] == 'reversed')}. "
        f"Long outputs gain more than short ones in {int(longer.sum())} of {len(order)} cells "
        f"({cells(longer)}).\n"
    )


def _waste_text(m: SpeedupMap) -> str:
    """Offline: predicted gain 1 / (1 - waste) next to the measured burst speedup."""
    burst = m.table[m.table["load"] == BURST].set_index(["length_class", "max_batch_size"])
    headers = ["class"] + [f"B = {b}: waste / predicted / measured" for b in m.config.batch_sizes]
    rows = []
    for name in m.config.classes:
        low, high = m.lengths[name]
        row = [name]
        for b in m.config.batch_sizes:
            waste = wasted_share(low, high, b)
            row.append(f"{waste:.0%} / {1 / (1 - waste):.2f}x / {burst.loc[(name, b), 'speedup']:.2f}x")
        rows.append(row)
    b0 = m.config.batch_sizes[0]
    return (
        "**Offline, the gain is the wasted slots.** A static batch decodes until its longest sequence "
        "ends; its other slots idle for the difference, a share 1 - mean / E[max of B] of the batch's "
        "slot-time, which continuous batching refills. Offline, with the GPU always busy, the speedup "
        "should then be about 1 / (1 - waste) (the cost of a decode step barely depends on how many "
        "slots are busy):\n\n" + markdown_table(headers, rows, [False] + [True] * len(m.config.batch_sizes))
        + "\n" + _relative_spread_sentence(m, b0)
    )


def _relative_spread_sentence(m: SpeedupMap, batch_size: int) -> str:
    if "short" not in m.lengths or "long" not in m.lengths:
        return ""
    short, long = m.lengths["short"], m.lengths["long"]
    return (
        f"The waste depends on the *relative* spread of lengths, not on their size: at B = {batch_size} a "
        f"short batch wastes {wasted_share(*short, batch_size):.0%} of its slots, a long one "
        f"{wasted_share(*long, batch_size):.0%} ({long[0]}-{long[1]} is a narrow range relative to its mean), "
        "so offline the longer class gains less — the opposite of the quoted claim. Larger batches raise "
        "every class's waste (the expected maximum creeps up to the top of the range) and so the offline gain.\n"
    )


def _load_text(m: SpeedupMap) -> str:
    """Under load: queueing amplifies a throughput gain into a larger latency gain."""
    table = m.table
    top = max(m.config.loads)
    loaded = table[table["load"] == top]
    burst = table[table["load"] == BURST].set_index(["length_class", "max_batch_size"])
    amplification = loaded.apply(
        lambda r: r["speedup"] / burst.loc[(r["length_class"], r["max_batch_size"]), "speedup"], axis=1
    )
    by_load = table[table["load"] != BURST].groupby("load")["speedup"].median()
    trend = ", ".join(f"{_load_label(load)} {value:.2f}x" for load, value in by_load.items())
    return (
        "**Under load, queueing multiplies it.** With open-loop arrivals a request that arrives while a "
        "static batch runs waits for the whole batch to end, and near static's capacity its queue grows "
        "like rho / (1 - rho), while continuous batching, with more throughput, runs the same arrivals at "
        f"a lower utilization. The median speedup over cells rises with load: {trend}. At {top:g} x capacity "
        f"the speedup is {amplification.min():.2f}-{amplification.max():.2f} times the offline one of the "
        "same class and batch size. Queueing multiplies the offline gain rather than replacing it: a load "
        "fraction of static's capacity puts continuous batching at about that fraction / its throughput "
        "gain, so the class that wastes fewer slots also queues relatively more. "
        f"The order of the classes under load is the offline order (same batch size) in {_same_order(m)}.\n"
    )


def _same_order(m: SpeedupMap) -> str:
    """How many loaded (load, batch size) cells rank the classes as the burst does, in words."""
    wide = m.table.pivot_table(index=["load", "max_batch_size"], columns="length_class", values="speedup",
                               sort=False)  # fmt: skip
    offline = {b: list(wide.loc[(BURST, b)].sort_values().index) for b in m.config.batch_sizes}
    loaded = [(load, b) for load, b in wide.index if load != BURST]
    same = sum(list(wide.loc[(load, b)].sort_values().index) == offline[b] for load, b in loaded)
    return f"{same} of {len(loaded)} cells"


# --------------------------------------------------------------------------- capacity, precision
def _capacity(m: SpeedupMap) -> str:
    caps = m.capacity
    headers = ["class", "B", "saturation (req/s)", "batch time T (s)", "SLO: p99 E2E <= (s)", "capacity (req/s)",
               "capacity / saturation"]  # fmt: skip
    rows = [[r.length_class, str(int(r.max_batch_size)), f"{r.saturation_rps:.3f}", f"{r.batch_time_s:.1f}",
             f"{r.slo_e2e_p99_s:.1f}", f"{r.capacity_rps:.3f}", f"{r.capacity_frac:.2f}"]
            for r in caps.itertuples(index=False)]  # fmt: skip
    capped = int((caps["capacity_frac"] >= 1.0).sum())
    k = m.config.slo_batches
    return (
        "*Saturation* is static's request throughput in the burst (batches back to back, always full); "
        "*batch time* T = B / saturation is the mean duration of one full static batch. Static's "
        f"**capacity** is the highest Poisson rate found by the capacity search (`sim.capacity`, tolerance "
        f"{m.config.tolerance:.0%}, seed(s) {', '.join(str(s) for s in m.config.capacity_seeds)}) at which "
        f"every request completes and p99 E2E <= {k:g} T, searched at or below saturation. Why {k:g} T: under "
        "load a static request waits for the batch in flight and then runs in its own, about 2 T at p99 "
        f"even at moderate load; {k:g} T allows one more batch of queueing, so 'within capacity' means "
        "the queue stays about one batch deep. Above saturation no SLO can hold for long (the queue grows "
        "without bound) but a finite run can still meet a loose one, so the search stops there: "
        f"{capped} of {len(caps)} capacities equal the saturation throughput (the SLO held up to it), and "
        f"capacity / saturation is {caps['capacity_frac'].min():.2f}-{caps['capacity_frac'].max():.2f}.\n\n"
        + markdown_table(headers, rows, [False] + [True] * 6)
    )


def _precision(m: SpeedupMap) -> str:
    table = m.table
    spread = table.groupby("load", sort=False)["speedup_spread"]
    text = ", ".join(f"{_load_label(load)} {s.median():.1%} / {s.max():.1%}" for load, s in spread)
    counts = ", ".join(str(m.config.requests(b)) for b in m.config.batch_sizes)
    return (
        f"Requests per run: {m.config.batches_per_run} x B ({counts}); "
        f"{len(m.config.seeds)} seeds per cell. Seed-to-seed spread of the speedup, (max - min) / mean, median / "
        f"worst over cells, per load: {text}. The mean over {len(m.config.seeds)} seeds has a standard error of "
        "roughly a third of that spread. Beyond capacity (the highest load) static's queue grows for the "
        "whole run, so its mean E2E, and the speedup, grow with the number of requests: those cells are "
        "transient, not steady-state, numbers.\n"
    )


def conclusion(m: SpeedupMap, band: tuple[float, float] = CLAIMED_SPEEDUP_RANGE) -> str:
    """The map's conclusion in one paragraph, for ``batching_speedup.md``."""
    table = m.table
    burst = table[table["load"] == BURST]
    inside = table[table["speedup"].between(*band)]
    loads = sorted({_load_label(x) for x in inside["load"]})
    order = length_order(m)
    return (
        "**What the map says** ([speedup_map.md](speedup_map.md)). This table is one column of a map over "
        f"length class x load x max batch size ({len(table)} cells). Offline the speedup is "
        f"{burst['speedup'].min():.2f}x-{burst['speedup'].max():.2f}x, about 1 / (1 - wasted-slot share): "
        "static batching only loses the slots that idle until each batch's longest sequence ends, which "
        f"grows with batch size and the relative spread of lengths. The quoted {band[0]:g}x-{band[1]:g}x "
        f"appears in {len(inside)} of {len(table)} cells, all under open-loop load ({', '.join(loads) or 'none'}), "
        "where requests queue behind static's whole-batch service. \"The longer the output, the larger the "
        f"gain\" holds in {int((order['verdict'] == 'holds').sum())} of {len(order)} load x batch cells and "
        f"is reversed in {int((order['verdict'] == 'reversed').sum())}: 1000-2000 tokens is a narrow range "
        "for its mean, so long outputs waste fewer slots than short ones, and under load queueing multiplies "
        "that same offline gain rather than replacing it.\n"
    )
