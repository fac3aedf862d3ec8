"""Fit reports: held-out error of each component, as Markdown text and a PNG figure.

``calibration_report`` covers one (model, TP): linear ops, attention (decode and
prefill), all-reduce and CPU overhead, each scored on held-out profile rows (see
:mod:`sim.calibration.holdout`), with the curves plotted over the profile points.
``transfer_report`` covers the roofline: each profiled model predicted from
efficiencies fitted on the other five.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from sim.calibration import (  # noqa: E402
    fitting,
    holdout,
    roofline_fit,  # noqa: E402
)
from sim.calibration.profiles import (  # noqa: E402
    GPU_TITLES,
    ProfileSet,
    all_reduce_file,
    licence,
)
from sim.hardware import scaling  # noqa: E402
from sim.hardware.catalog import GPUS, GPUSpec, get_model  # noqa: E402
from sim.hardware.curves import PiecewiseLinear, Values  # noqa: E402
from sim.io.safe_write import atomic_file, write_text  # noqa: E402

# Decode batches (sequences, context tokens each) at which the share of transferred
# attention in a step is reported for GPUs without an attention profile.
SHARE_BATCHES = ((1, 1024), (32, 1024), (128, 2048))

TARGETS = {"linear": 0.05, "attention_decode": 0.10, "attention_prefill": 0.10}
TRANSFER_TARGET = 0.10
GPU_TRANSFER_TARGET = 0.08


def _rows(results: list[holdout.Holdout]) -> list[str]:
    lines = [
        "| component | held-out rows > 0.05 ms | MAPE | worst | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for h in results:
        s = h.summary()
        target = TARGETS.get(h.name)
        met = "—" if target is None else ("yes" if s["mape"] <= target else "no")
        target_text = "—" if target is None else f"<= {target:.0%}"
        lines.append(
            f"| {h.name} | {s['rows']} | {s['mape']:.1%} | {s['worst']:.1%} "
            f"| {target_text} | {met} |"
        )
    return lines


def calibration_report(
    profiles: ProfileSet, model: str, tp: int, out_dir: str | Path
) -> tuple[str, Path, Path]:
    """Write ``<model>_<gpu>_tp<tp>_fit.md`` and ``.png`` into ``out_dir``.

    The GPU is ``profiles.gpu``; for one without an attention profile the report adds
    the share of a decode step that the transferred attention takes.

    Returns:
        (markdown text, markdown path, PNG path).
    """
    out_dir = Path(out_dir)
    gpu = profiles.gpu
    stem = f"{model}_{gpu}_tp{tp}_fit"
    results = holdout.component_holdouts(profiles, get_model(model), tp)
    png = out_dir / f"{stem}.png"
    _plot_calibration(profiles, model, tp, results, png)
    lines = [
        f"# Fit report: {model}, {GPU_TITLES[gpu]}, TP{tp}",
        "",
        "Each component is refitted on alternate profile rows and scored on the rows left out "
        "(committed calibrations keep every row as a knot). Errors are relative, over held-out "
        "rows "
        "whose measured time is above 0.05 ms.",
        "",
        *_rows(results),
        "",
    ]
    lines += [f"- {h.name}: {h.note}" for h in results]
    lines += [
        "- lm_head: not profiled (estimated from the MLP up-projection; see docs/cost_model.md)",
        "",
    ]
    if gpu != "a100-80gb":
        lines += _transferred_share_lines(profiles, model, tp)
    lines += [
        f"![curves vs profile points]({png.name})",
        "",
        f"Source: {licence(gpu)}.",
        "",
    ]
    text = "\n".join(lines)
    md = out_dir / f"{stem}.md"
    write_text(md, text, field="report-dir")
    return text, md, png


def _transferred_share_lines(profiles: ProfileSet, model: str, tp: int) -> list[str]:
    from sim.calibration.calibrate import calibrate  # calibrate imports nothing from here
    from sim.hardware.cost_model import CostModel

    data = calibrate(profiles, model, profiles.gpu, tp)
    cost = CostModel(data, get_model(model), label="calibrated", source="")
    lines = [
        f"Not profiled on {profiles.gpu}, carried from the A100: attention "
        f"({data['attention']['note'].split('then by ')[-1]}), CPU overhead (A100 host). "
        "Share of a decode step (batch x context) that the transferred attention takes:",
        "",
        "| decode batch | context | step ms | attention ms | attention share | CPU share |",
        "|---|---|---|---|---|---|",
    ]
    for seqs, context in SHARE_BATCHES:
        parts = cost.breakdown_from_totals_s(0, 0, 0.0, seqs, seqs * context)
        total = sum(parts.values())
        attn, cpu = parts["attention_decode"], parts.get("cpu_overhead", 0.0)
        lines.append(
            f"| {seqs} | {context} | {1e3 * total:.2f} | {1e3 * attn:.2f} "
            f"| {attn / total:.1%} | {cpu / total:.1%} |"
        )
    return [*lines, ""]


def _plot_calibration(
    profiles: ProfileSet, model: str, tp: int, results: list[holdout.Holdout], path: Path
) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    _plot_linear(axes[0, 0], profiles, model, tp)
    _plot_decode(axes[0, 1], profiles)
    _plot_prefill(axes[0, 2], profiles)
    _plot_all_reduce(axes[1, 0], profiles, tp)
    _plot_cpu(axes[1, 1], profiles, model, tp)
    _plot_errors(axes[1, 2], results)
    fig.suptitle(
        f"{model} on {GPU_TITLES[profiles.gpu]}, TP{tp}: fitted curves (lines) vs profile "
        f"medians (points)"
    )
    fig.tight_layout()
    with atomic_file(path, field="report-dir") as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


def _plot_linear(ax: Axes, profiles: ProfileSet, model: str, tp: int) -> None:
    spec = get_model(model)
    tokens, ms = fitting.linear_points(profiles.mlp(model), spec, tp)
    knots = fitting.monotone_knots(tokens, ms)
    ylabel = f"linear ops, all {spec.num_layers} layers (ms)"
    _plot_curve(ax, tokens, ms, *knots, "tokens in iteration", ylabel, logx=True)


def _plot_all_reduce(ax: Axes, profiles: ProfileSet, tp: int) -> None:
    if tp == 1 or all_reduce_file(profiles.gpu) is None:
        ax.set_axis_off()
        return
    table = profiles.all_reduce(tp)
    knots = fitting.all_reduce_knots(table)
    ylabel = f"all-reduce, {tp} GPUs (ms)"
    _plot_curve(
        ax, table["size"], table["ms"], *knots, "message bytes", ylabel, logx=True, logy=True
    )


def _plot_cpu(ax: Axes, profiles: ProfileSet, model: str, tp: int) -> None:
    cpu = profiles.cpu()
    src_model, src_tp = scaling.cpu_source(fitting.cpu_pairs(cpu), get_model(model), tp)
    rows = cpu[(cpu["model"] == src_model) & (cpu["tp"] == src_tp)]
    knots = fitting.cpu_points(cpu, src_model, src_tp)
    ylabel = f"CPU overhead, {src_model} TP{src_tp} (ms)"
    _plot_curve(ax, rows["batch_size"], rows["ms"], *knots, "sequences in batch", ylabel)


def _plot_curve(
    ax: Axes,
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    knots_x: Values,
    knots_y: Values,
    xlabel: str,
    ylabel: str,
    *,
    logx: bool = False,
    logy: bool = False,
) -> None:
    curve = PiecewiseLinear(knots_x, knots_y)
    grid = (
        np.geomspace(min(knots_x), max(knots_x), 400)
        if logx
        else np.linspace(min(knots_x), max(knots_x), 400)
    )
    ax.plot(x, y, ".", ms=3, color="tab:gray", label="profile median")
    ax.plot(grid, [curve(g) for g in grid], "-", color="tab:blue", lw=1.2, label="fitted curve")
    ax.set(
        xlabel=xlabel,
        ylabel=ylabel,
        xscale="log" if logx else "linear",
        yscale="log" if logy else "linear",
    )
    ax.legend(fontsize=8)


def _plot_decode(ax: Axes, profiles: ProfileSet) -> None:
    dec, _ = profiles.attention()
    coef = fitting.fit_decode(dec)
    for batch, color in zip(
        (8, 32, 64, 128), ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True
    ):
        rows = dec[dec["batch_size"] == batch].sort_values("kv_cache_size")
        ctx = rows["kv_cache_size"].to_numpy(float)
        ax.plot(ctx, rows["ms"], ".", ms=3, color=color)
        ax.plot(
            ctx,
            fitting.decode_ms(coef, np.full_like(ctx, batch), batch * ctx),
            "-",
            color=color,
            label=f"batch {batch}",
        )
    ax.set(
        xlabel="context tokens per sequence",
        ylabel="decode attention per layer (ms)",
        title="Llama-2-70B TP2 profile",
    )
    ax.legend(fontsize=8)


def _plot_prefill(ax: Axes, profiles: ProfileSet) -> None:
    _, pre = profiles.attention()
    coef = fitting.fit_prefill(pre)
    for ctx, color in zip(
        (0, 1024, 2048, 3072), ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True
    ):
        rows = pre[pre["kv_cache_size"] == ctx].sort_values("chunk")
        chunk = rows["chunk"].to_numpy(float)
        ax.plot(chunk, rows["ms"], ".", ms=3, color=color)
        ax.plot(
            chunk,
            fitting.prefill_ms(coef, chunk, chunk * (ctx + chunk / 2)),
            "-",
            color=color,
            label=f"context {ctx}",
        )
    ax.set(
        xlabel="chunk tokens",
        ylabel="prefill attention per layer (ms)",
        title="Llama-2-70B TP2 profile",
    )
    ax.legend(fontsize=8)


def _plot_errors(ax: Axes, results: list[holdout.Holdout]) -> None:
    names = [h.name for h in results]
    summaries = [h.summary() for h in results]
    x = np.arange(len(names))
    ax.bar(x - 0.2, [100 * s["mape"] for s in summaries], 0.4, label="MAPE")
    ax.bar(x + 0.2, [100 * s["worst"] for s in summaries], 0.4, label="worst")
    for i, name in enumerate(names):
        if name in TARGETS:
            ax.hlines(100 * TARGETS[name], i - 0.4, i + 0.4, colors="k", linestyles="--")
    ax.set_xticks(x, [n.replace("_", "\n") for n in names], fontsize=8)
    ax.set(ylabel="held-out error (%)", title="held-out error (dashes: MAPE target)")
    ax.legend(fontsize=8)


def transfer_report(profiles: ProfileSet, out_dir: str | Path) -> tuple[str, Path, Path]:
    """Leave-one-model-out roofline transfer on ``profiles.gpu``: write the Markdown and PNG.

    A100: ``transfer_loo.md`` / ``.png`` over the six models of its roofline fit (target
    10%); other GPUs: ``transfer_loo_<gpu>.md`` / ``.png`` over every model profiled on
    them (target 8%, the per-GPU target of the GPU issue).
    """
    out_dir = Path(out_dir)
    gpu = GPUS[profiles.gpu]
    reference = gpu.name == "a100-80gb"
    tables = profiles.all_mlp(extra=not reference)
    target = TRANSFER_TARGET if reference else GPU_TRANSFER_TARGET
    stem = "transfer_loo" if reference else f"transfer_loo_{gpu.name}"
    loo = roofline_fit.leave_one_model_out(tables, gpu)
    png = out_dir / f"{stem}.png"
    _plot_transfer(tables, gpu, png)
    lines = [
        f"# Roofline transfer on {GPU_TITLES[gpu.name]}: leave one profiled model out",
        "",
        f"Per-op compute and memory efficiencies are fitted on {len(tables) - 1} of the "
        f"{len(tables)} models profiled on this GPU (all their TP degrees); the held-out model's "
        "per-layer linear-op time is then predicted from its architecture alone and compared "
        f"with its profile at every (TP, token count). Target: MAPE <= {target:.0%}.",
        "",
        "| held-out model | rows > 0.05 ms | MAPE | worst | mean signed error | met |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in loo.items():
        met = "yes" if s["mape"] <= target else "no"
        lines.append(
            f"| {name} | {s['rows']} | {s['mape']:.1%} | {s['worst']:.1%} "
            f"| {s['bias']:+.1%} | {met} |"
        )
    lines += ["", f"![measured vs transferred]({png.name})", "", f"Source: {licence(gpu.name)}.", ""]
    text = "\n".join(lines)
    md = out_dir / f"{stem}.md"
    write_text(md, text, field="report-dir")
    return text, md, png


def _plot_transfer(tables: dict, gpu: GPUSpec, path: Path) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    for ax, name in zip(axes.flat, tables, strict=False):
        pairs = roofline_fit.transfer_pairs(tables, name, gpu)
        for tp, color in zip(
            sorted(set(pairs["tp"])),
            ("tab:blue", "tab:orange", "tab:green", "tab:red"),
            strict=False,
        ):
            rows = pairs[pairs["tp"] == tp]
            ax.plot(rows["tokens"], rows["measured_ms"], ".", ms=2, color=color)
            ax.plot(rows["tokens"], rows["predicted_ms"], "-", color=color, lw=1, label=f"TP{tp}")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="tokens",
            ylabel="linear ops per layer (ms)",
            title=f"{name} (held out)",
        )
        ax.legend(fontsize=8)
    fig.suptitle(
        f"Roofline transfer on {GPU_TITLES[gpu.name]}: profile (points) vs prediction "
        "from the other profiled models (lines)"
    )
    fig.tight_layout()
    with atomic_file(path, field="report-dir") as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)
