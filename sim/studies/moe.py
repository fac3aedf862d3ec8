"""``results/moe.md``: mixture-of-experts scenarios, what fits on 8 GPUs, and cost vs batch size.

:func:`write_moe_report` runs every ``scenarios/moe/*.yaml`` (the main report only discovers
``scenarios/*.yaml`` and ``scenarios/seed_table/``), writes each run to ``results/moe/<name>/``,
then ``results/moe.md`` and ``results/moe_cost.png``: per-token cost against batch size for a
dense model and a MoE model of similar active size (the MoE curve stays memory-bound much
longer, since every extra token can wake up another expert's weights).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from sim.errors import UserError
from sim.hardware.catalog import get_gpu, get_model
from sim.hardware.cost_model import CostModel, load_cost_model
from sim.hardware.memory import GIB, estimate_activation_reserve_bytes, kv_budget
from sim.io.outputs import atomic_file

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios" / "moe"
MOE_FOLDER = "moe"
# (label, model, GPU, TP) curves of the cost plot: similar active size, dense vs MoE.
COST_PAIRS = (
    ("Mistral-Nemo-12B, dense (12.2B)", "mistral-nemo-12b", "a100-80gb", 2),
    ("Mixtral-8x7B, MoE (12.9B active of 46.7B)", "mixtral-8x7b", "a100-80gb", 2),
)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
TABLE_BATCHES = (1, 8, 64, 256, 1024, 4096)
CONTEXT_TOKENS = 512  # each decode sequence's cache in the cost curves
FIT_CASES = (("deepseek-v3", "fp8"), ("deepseek-v3-bf16", "bf16"))
FIT_GPUS = ("a100-80gb", "h100-sxm", "h200")


def write_moe_report(out_dir: Path, plots: bool, scenarios_dir: Path = SCENARIOS_DIR) -> None:
    """Run the MoE scenarios into ``out_dir/moe/`` and write ``moe.md`` (and ``moe_cost.png``)."""
    from sim.io.scenario import load_scenario
    from sim.runner import run

    summaries = {}
    for path in sorted(scenarios_dir.glob("*.yaml")):
        result = run(load_scenario(path))
        result.save(out_dir / MOE_FOLDER / result.scenario.name, plots=plots)
        summaries[result.scenario.name] = (result.summary, result.facts["cost_model"])
    curves = cost_curves()
    with atomic_file(out_dir / "moe.md") as tmp:
        tmp.write_text(moe_markdown(summaries, curves))
    if plots:
        from sim.report.plots import save_figure

        with atomic_file(out_dir / "moe_cost.png") as tmp:
            save_figure(cost_figure(curves), tmp)


def _decode_step_s(cost: CostModel, batch: int) -> float:
    return cost.time_from_totals_s(0, 0, 0.0, batch, batch * CONTEXT_TOKENS)


def cost_curves() -> pd.DataFrame:
    """Decode step time per token (ms) at each batch size for the plotted pairs and DeepSeek-V3."""
    rows = []
    cases = [*COST_PAIRS, ("DeepSeek-V3 fp8, 8x H200 (37.6B active of 671B)", "deepseek-v3", "h200", 8)]
    for label, model, gpu, tp in cases:
        cost = load_cost_model(model, gpu, tp, cpu_overhead=False)
        for batch in BATCHES:
            step = _decode_step_s(cost, batch)
            rows.append({"label": label, "model": model, "batch": batch, "step_ms": step * 1e3,
                         "per_token_ms": step * 1e3 / batch, "cost_model": cost.label})
    return pd.DataFrame(rows)


def cost_figure(curves: pd.DataFrame) -> Figure:
    """Per-token decode cost vs batch size, dense vs MoE, with each model's weight-read floor."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for (label, model, gpu, tp), color in zip(COST_PAIRS, ("tab:blue", "tab:orange"), strict=True):
        rows = curves[curves["model"] == model]
        ax.plot(rows["batch"], rows["per_token_ms"], marker="o", ms=3, color=color, label=label)
        spec = get_model(model)
        floor_ms = spec.active_params * spec.dtype_bytes / tp / (get_gpu(gpu).hbm_gb_per_s * 1e9) * 1e3
        ax.plot(rows["batch"], floor_ms / rows["batch"], ls=":", color=color, lw=1,
                label=f"{model}: active weights read once per step / HBM bandwidth")
    ax.set(xscale="log", yscale="log", xlabel="decode batch size (sequences, 512-token contexts)",
           ylabel="decode step time per token (ms)", title="A100-80GB x2 (TP2): per-token cost vs batch")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def fit_table() -> pd.DataFrame:
    """DeepSeek-V3 on 8 GPUs: weights per GPU and the KV room left, or by how much it is short."""
    rows = []
    for model_name, dtype in FIT_CASES:
        model = get_model(model_name)
        for gpu_name in FIT_GPUS:
            gpu = get_gpu(gpu_name)
            usable_gib = gpu.memory_gb * 0.9
            row = {"weights": dtype, "gpu": gpu_name, "weights_gb_per_gpu": model.weight_bytes / 8 / 1e9,
                   "usable_gib_per_gpu": usable_gib}
            try:
                budget = kv_budget(model, gpu, 8)
                row.update(fits="yes", kv_gib_per_gpu=budget.available_bytes / GIB, kv_tokens=budget.capacity_tokens)
            except UserError:  # the same arithmetic as the does-not-fit error
                short = (model.weight_bytes / 8 + estimate_activation_reserve_bytes(model, 8)) / GIB - usable_gib
                row.update(fits=f"no: {short:.1f} GiB/GPU short", kv_gib_per_gpu="—", kv_tokens=0)
            rows.append(row)
    return pd.DataFrame(rows)


def _scenario_section(name: str, summary: pd.DataFrame, label: str) -> str:
    table = summary.assign(
        ttft_p50_ms=summary["ttft_p50_s"] * 1e3, ttft_p99_ms=summary["ttft_p99_s"] * 1e3,
        tpot_p50_ms=summary["tpot_p50_s"] * 1e3, tpot_p99_ms=summary["tpot_p99_s"] * 1e3,
    )[["policy", "throughput_rps", "output_tps", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
       "e2e_mean_s", "mean_batch_size", "kv_peak_frac"]]
    return f"### {name}\n\nCost model: {label}; outputs in `results/moe/{name}/`.\n\n{_markdown(table)}\n"


def _markdown(frame: pd.DataFrame) -> str:
    def cell(value: object) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _cost_table(curves: pd.DataFrame) -> pd.DataFrame:
    picked = curves[curves["batch"].isin(TABLE_BATCHES)]
    table = picked.pivot(index="label", columns="batch", values="per_token_ms")
    table.columns = [f"B={b} (ms/token)" for b in table.columns]
    return table.reset_index()


def moe_markdown(summaries: dict[str, tuple[pd.DataFrame, str]], curves: pd.DataFrame) -> str:
    """The whole ``moe.md`` text."""
    parts = [
        "# Mixture-of-experts models\n\n"
        "Regenerated by `python -m sim report` (`sim/studies/moe.py`); the model is in `docs/moe.md`.\n"
        "Experts are priced by the tokens each activated expert receives under uniform top-k routing; "
        "MLA is absorbed for decode; fp8 weights are read at 1 byte/param and computed at the BF16 peak.\n",
        "## DeepSeek-V3 on 8 GPUs: what fits (tensor_parallel 8, gpu_memory_utilization 0.9)\n\n"
        + _markdown(fit_table()) + "\n",
        f"## Decode step time per token vs batch size ({CONTEXT_TOKENS}-token contexts, no CPU overhead)\n\n"
        "![per-token cost](moe_cost.png)\n\n" + _markdown(_cost_table(curves)) + "\n\n"
        "The dense model's per-token cost falls ~1/B until its GEMMs turn compute-bound; the MoE model reads "
        "more expert weights with every added token until all experts are touched, so it stays memory-bound "
        "to much larger batches and gains less from batching at small B.\n",
        "## Scenarios (`scenarios/moe/`)\n",
    ]
    parts += [_scenario_section(name, summary, label) for name, (summary, label) in summaries.items()]
    return "\n".join(parts)
