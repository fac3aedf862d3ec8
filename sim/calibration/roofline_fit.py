"""Fitting the roofline efficiencies and kernel latencies of :mod:`sim.hardware.roofline`.

Offline only: these read the profile tables (pandas) and write the efficiency curves and
leave-one-model-out errors that the roofline files carry; a run reads the curves back and
prices ops with :func:`sim.hardware.roofline.op_ms`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from sim.hardware.catalog import GPUSpec, get_model
from sim.hardware.curves import error_summary, log_spaced_indices
from sim.hardware.roofline import (
    ideal_s,
    layer_ops,
    op_work,
    predict_ops_ms,
)

EFFICIENCY_KNOTS = 48
WINDOW = 1.12
LATENCY_MAX_TOKENS = 8
LATENCY_CAP = 0.9
EFFICIENCY_NOTE = (
    "per op: time = latency + max(FLOPs / (peak x compute), bytes / (bandwidth x memory)); "
    "latency: intercept of time vs bytes on memory-bound rows of <= 8 tokens (capped at 90% of "
    "the op's fastest time); compute and "
    "memory are medians of ideal/measured over the six profiled models and their TP degrees, "
    "on rows where "
    "that roof binds, in a +-12% token window around each knot; interpolated in log(tokens)"
)


def efficiency_rows(
    tables: Mapping[str, pd.DataFrame], gpu: GPUSpec, latency_ms: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """One row per (model, TP, op, tokens): ideal / (measured - latency), the binding roof,
    the memory-roof time and the measured time (seconds)."""
    latency_ms = latency_ms or {}
    frames = []
    for name, table in tables.items():
        model = get_model(name)
        for tp, rows in table.groupby("tp"):
            tokens = rows["tokens"].to_numpy(float)
            for op, (flops, nbytes) in op_work(model, int(tp), tokens).items():
                if op not in rows.columns:
                    continue
                t_c, t_m = ideal_s(flops, nbytes, gpu)
                measured_s = rows[op].to_numpy(float) * 1e-3
                busy_s = np.maximum(measured_s - latency_ms.get(op, 0.0) * 1e-3, 1e-12)
                frames.append(
                    pd.DataFrame(
                        {
                            "model": name,
                            "op": op,
                            "tokens": tokens,
                            "ratio": np.maximum(t_c, t_m) / busy_s,
                            "compute_bound": t_c > t_m,
                            "memory_s": t_m,
                            "measured_s": measured_s,
                        }
                    )
                )
    return pd.concat(frames, ignore_index=True)


def fit_latencies(rows: pd.DataFrame) -> dict[str, float]:
    """Per-op fixed latency (ms): intercept of measured time vs memory-roof time over the
    memory-bound rows of <= LATENCY_MAX_TOKENS tokens, in [0, 90% of the fastest row]."""
    latency = {}
    for op, op_rows in rows.groupby("op", sort=False):
        small = op_rows[(op_rows["tokens"] <= LATENCY_MAX_TOKENS) & ~op_rows["compute_bound"]]
        if len(small) < 2:
            latency[str(op)] = 0.0
            continue
        design = np.column_stack([np.ones(len(small)), small["memory_s"]])
        (intercept, _), *_ = np.linalg.lstsq(design, small["measured_s"], rcond=None)
        cap = LATENCY_CAP * float(op_rows["measured_s"].min())
        latency[str(op)] = round(max(0.0, min(float(intercept), cap)) * 1e3, 7)
    return latency


def _window_medians(rows: pd.DataFrame, knots: np.ndarray, bound: pd.Series) -> list[float] | None:
    """Median ratio per knot over rows bound by this roof, where they are the majority.

    Near A100's ridge both roofs are close and both efficiencies dip; knots where this
    roof binds for fewer than half the rows take the nearest majority knot's value, so
    a GPU with a different ridge does not inherit A100's knee at the wrong token count.
    """
    if not bound.any():
        return None
    values = []
    for k in knots:
        window = rows["tokens"].between(k / WINDOW, k * WINDOW)
        majority = bound[window].mean() >= 0.5
        values.append(rows.loc[window & bound, "ratio"].median() if majority else np.nan)
    return [round(float(v), 4) for v in pd.Series(values).ffill().bfill()]


def fit_efficiencies(tables: Mapping[str, pd.DataFrame], gpu: GPUSpec) -> dict:
    """Latencies and efficiency curves per op from the MLP profiles of several models.

    Returns:
        ``{"tokens": [...], "latency_ms": {op: ms}, "ops": {op: {"compute": [...] | None,
        "memory": [...]}}}`` (see the module doc).
    """
    latency = fit_latencies(efficiency_rows(tables, gpu))
    rows = efficiency_rows(tables, gpu, latency)
    grid = np.unique(rows["tokens"])
    knots = grid[log_spaced_indices(grid, EFFICIENCY_KNOTS)]
    ops = {}
    for op, op_rows in rows.groupby("op", sort=False):
        bound = op_rows["compute_bound"]
        ops[str(op)] = {
            "compute": _window_medians(op_rows, knots, bound),
            "memory": _window_medians(op_rows, knots, ~bound),
        }
    return {"tokens": [int(k) for k in knots], "latency_ms": latency, "ops": ops}


def leave_one_model_out(tables: Mapping[str, pd.DataFrame], gpu: GPUSpec) -> dict[str, dict]:
    """Transfer error per profiled model: fit on the others, predict its linear ops.

    Returns, per held-out model, MAPE / worst / rows over every profiled (TP, tokens)
    of the per-layer linear-op sum, plus the mean signed error (``bias``).
    """
    report = {}
    for held_out, table in tables.items():
        eff = fit_efficiencies({m: t for m, t in tables.items() if m != held_out}, gpu)
        measured, predicted = per_layer_pairs(eff, held_out, table, gpu)
        summary = error_summary(predicted, measured)
        summary["bias"] = round(float(np.mean((predicted - measured) / measured)), 4)
        report[held_out] = summary
    return report


def per_layer_pairs(
    eff: dict, name: str, table: pd.DataFrame, gpu: GPUSpec
) -> tuple[np.ndarray, np.ndarray]:
    model = get_model(name)
    measured, predicted = [], []
    for tp, rows in table.groupby("tp"):
        tokens = rows["tokens"].to_numpy(float)
        ops = [op for op in layer_ops(model) if op in rows.columns]
        per_op = predict_ops_ms(eff, model, int(tp), gpu, tokens)
        measured.append(rows[ops].sum(axis=1).to_numpy(float))
        predicted.append(sum(per_op[op] for op in ops))
    return np.concatenate(measured), np.concatenate(predicted)


def transfer_pairs(tables: Mapping[str, pd.DataFrame], held_out: str, gpu: GPUSpec) -> pd.DataFrame:
    """Measured vs leave-one-out predicted per-layer ms of ``held_out`` (for plots)."""
    eff = fit_efficiencies({m: t for m, t in tables.items() if m != held_out}, gpu)
    table = tables[held_out]
    measured, predicted = per_layer_pairs(eff, held_out, table, gpu)
    return pd.DataFrame(
        {
            "tp": np.concatenate([r["tp"].to_numpy() for _, r in table.groupby("tp")]),
            "tokens": np.concatenate([r["tokens"].to_numpy() for _, r in table.groupby("tp")]),
            "measured_ms": measured,
            "predicted_ms": predicted,
        }
    )
