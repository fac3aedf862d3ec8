"""Held-out error of every fitted component.

Committed calibrations keep every profiled point as a knot, so their in-sample error
at those points is zero by construction and says nothing. Instead each component is
refitted on alternate profile rows (even positions after sorting) and scored on the
rows left out: MAPE and worst relative error over rows whose measured time is above
0.05 ms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.calibration import fitting
from sim.calibration.profiles import GPU_TITLES, ProfileSet, all_reduce_file
from sim.hardware import scaling
from sim.hardware.catalog import ModelSpec
from sim.hardware.curves import PiecewiseLinear, error_summary, isotonic


@dataclass(frozen=True)
class Holdout:
    """Measured vs predicted values of one component on its held-out rows.

    Attributes:
        name: component name (as in the breakdown).
        x: the row's position on the component's main axis (tokens, bytes, batch size...).
        measured_ms: profile medians of the held-out rows.
        predicted_ms: the refitted component's prediction for them.
        note: what the rows are.
    """

    name: str
    x: np.ndarray
    measured_ms: np.ndarray
    predicted_ms: np.ndarray
    note: str

    def summary(self) -> dict[str, float]:
        """MAPE, worst and row count over held-out rows above 0.05 ms."""
        return error_summary(self.predicted_ms, self.measured_ms)


def _split(n: int) -> tuple[np.ndarray, np.ndarray]:
    index = np.arange(n)
    return index % 2 == 0, index % 2 == 1


def _curve_holdout(
    name: str,
    xs: np.ndarray,
    ys: np.ndarray,
    monotone: Callable[[np.ndarray], np.ndarray],
    note: str,
) -> Holdout:
    train, test = _split(len(xs))
    curve = PiecewiseLinear(xs[train], monotone(ys[train]))
    predicted = np.array([curve(x) for x in xs[test]])
    return Holdout(name, xs[test], ys[test], predicted, note)


def linear_holdout(mlp: pd.DataFrame, model: ModelSpec, tp: int) -> Holdout:
    """Linear ops per iteration: knots on even token counts, scored on odd ones."""
    tokens, ms = fitting.linear_points(mlp, model, tp)
    return _curve_holdout(
        "linear", tokens, ms, isotonic, f"{model.name} TP{tp}, all layers + embedding"
    )


def decode_holdout(decode: pd.DataFrame) -> Holdout:
    """Decode attention per layer: fitted on even rows, scored on odd rows."""
    rows = decode.sort_values(["batch_size", "kv_cache_size"]).reset_index(drop=True)
    train, test = _split(len(rows))
    coef = fitting.fit_decode(rows[train])
    held = rows[test]
    kv = (held["batch_size"] * held["kv_cache_size"]).to_numpy(float)
    predicted = fitting.decode_ms(coef, held["batch_size"].to_numpy(float), kv)
    return Holdout(
        "attention_decode",
        kv,
        held["ms"].to_numpy(float),
        predicted,
        "Llama-2-70B TP2 FlashAttention decode, per layer; x = KV tokens read",
    )


def prefill_holdout(prefill: pd.DataFrame) -> Holdout:
    """Prefill attention per layer: fitted on even rows, scored on odd rows."""
    rows = prefill.sort_values(["chunk", "kv_cache_size"]).reset_index(drop=True)
    train, test = _split(len(rows))
    coef = fitting.fit_prefill(rows[train])
    held = rows[test]
    chunk = held["chunk"].to_numpy(float)
    work = chunk * (held["kv_cache_size"].to_numpy(float) + chunk / 2)
    return Holdout(
        "attention_prefill",
        work,
        held["ms"].to_numpy(float),
        fitting.prefill_ms(coef, chunk, work),
        "Llama-2-70B TP2 FlashAttention prefill, per layer; x = chunk x (context + chunk/2)",
    )


def all_reduce_holdout(table: pd.DataFrame, tp: int, gpu: str = "a100-80gb") -> Holdout:
    """All-reduce: isotonic knots from even sizes, scored on odd sizes."""
    rows = table.sort_values("size").reset_index(drop=True)
    train, test = _split(len(rows))
    xs, ys = fitting.all_reduce_knots(rows[train])
    curve = PiecewiseLinear(xs, ys)
    held = rows[test]
    predicted = np.array([curve(x) for x in held["size"].to_numpy(float)])
    return Holdout(
        "all_reduce",
        held["size"].to_numpy(float),
        held["ms"].to_numpy(float),
        predicted,
        f"NCCL all-reduce on {tp} {_gpu_plural(gpu)}; x = message bytes",
    )


def _gpu_plural(gpu: str) -> str:
    return "A100s" if gpu == "a100-80gb" else f"{GPU_TITLES[gpu]}s"


def cpu_holdout(cpu: pd.DataFrame, model: str, tp: int) -> Holdout:
    """CPU overhead: knots on alternate batch sizes of the source (model, TP)."""
    rows = cpu[(cpu["model"] == model) & (cpu["tp"] == tp)].sort_values("batch_size")
    xs, ys = rows["batch_size"].to_numpy(float), rows["ms"].to_numpy(float)
    return _curve_holdout("cpu_overhead", xs, ys, isotonic, f"engine CPU time of {model} TP{tp}")


def component_holdouts(profiles: ProfileSet, model: ModelSpec, tp: int) -> list[Holdout]:
    """Held-out results of every profiled component of (model, TP), in breakdown order."""
    dec, pre = profiles.attention()
    results = [
        linear_holdout(profiles.mlp(model.name), model, tp),
        decode_holdout(dec),
        prefill_holdout(pre),
    ]
    if tp > 1 and all_reduce_file(profiles.gpu):
        results.append(all_reduce_holdout(profiles.all_reduce(tp), tp, profiles.gpu))
    source = scaling.cpu_source(fitting.cpu_pairs(profiles.cpu()), model, tp)
    return [*results, cpu_holdout(profiles.cpu(), *source)]
