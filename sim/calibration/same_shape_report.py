"""The same-shape pairs ``calibrate`` finds from the catalog's layer shapes, and how well the premise holds.

A catalog model without a calibration of its own on a (GPU, TP) borrows the committed calibration of a
model with its layer shapes there (:mod:`sim.hardware.same_shape`). Where the borrowing model was profiled
itself (Llama-3-70B on the A100), its own linear-op rows score the borrowed curve: the error of pricing a
model by its twin's measurements instead of its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.calibration.fitting import linear_points
from sim.calibration.profiles import GPU_DIRS, ProfileSet, mlp_file
from sim.errors import UserError
from sim.hardware.calibration_files import CALIBRATION_DIR, calibration_filename, read_yaml
from sim.hardware.catalog import get_model
from sim.hardware.cost_model import calibrated_configs
from sim.hardware.curves import PiecewiseLinear, error_summary
from sim.hardware.same_shape import LABEL, same_shape_configs
from sim.io.safe_write import write_text

REPORT_NAME = "same_shape.md"


def pair_lines(involving: str | None = None) -> list[str]:
    """One line per model priced by a twin (only pairs with ``involving`` on either side when given), e.g.
    ``llama-3-70b: same-shape (llama-2-70b) on a100-80gb TP 2,4; h100-sxm TP 2,4,8``."""
    grouped: dict[tuple[str, str], dict[str, list[int]]] = {}
    for name, twin, gpu, tp in same_shape_configs(calibrated_configs()):
        if involving is None or involving in (name, twin):
            grouped.setdefault((name, twin), {}).setdefault(gpu, []).append(tp)
    return [
        f"{name}: {LABEL.format(twin=twin)} on "
        + "; ".join(f"{gpu} TP {','.join(map(str, sorted(tps)))}" for gpu, tps in per_gpu.items())
        for (name, twin), per_gpu in grouped.items()
    ]


def premise_rows(profiles: ProfileSet) -> list[dict]:
    """The borrowed linear curve scored on the borrowing model's own profile, where one exists.

    Returns:
        One dict per (model, twin, GPU, TP) with a profile of the model at that TP: ``mape``, ``worst``,
        ``bias`` (mean signed error, fractions) and ``rows`` over its profiled token counts, split at the
        twin's last profiled count (``tokens``: where the twin's curve stops being measured).
    """
    rows = []
    for name, twin, gpu, tp in same_shape_configs(calibrated_configs()):
        own = ProfileSet(profiles.root, gpu)
        if not _has_profile(own, name):
            continue
        table = own.mlp(name)
        if tp not in set(table["tp"]):
            continue
        tokens, measured = linear_points(table, get_model(name), tp)
        linear = read_yaml(CALIBRATION_DIR / calibration_filename(twin, gpu, tp))["linear"]
        curve = PiecewiseLinear(linear["tokens"], linear["ms"])
        predicted = np.array([curve(float(t)) for t in tokens])
        # The twin's knots end at its last profiled count; beyond it the curve is extrapolated.
        within = tokens <= linear["tokens"][-1]
        for where, keep in ((f"<= {linear['tokens'][-1]}", within), ("beyond (extrapolated)", ~within)):
            if keep.any():
                rows.append({"model": name, "twin": twin, "gpu": gpu, "tp": tp, "tokens": where,
                             **_errors(predicted[keep], measured[keep])})  # fmt: skip
    return rows


def _errors(predicted: np.ndarray, measured: np.ndarray) -> dict:
    summary = error_summary(predicted, measured)
    summary["bias"] = round(float(np.mean(predicted / measured - 1)), 4)
    return summary


def _has_profile(profiles: ProfileSet, model: str) -> bool:
    try:
        return (profiles.root / mlp_file(model, profiles.gpu)).is_file()
    except UserError:  # no profile stem for this model: never profiled
        return False


def same_shape_report(profiles: ProfileSet, report_dir: str | Path) -> tuple[str, Path]:
    """Write ``same_shape.md`` (pairs and premise check) into ``report_dir``; return (text, path)."""
    lines = [
        "# Same-shape calibrations",
        "",
        "A model with no calibration of its own on a (GPU, TP) uses the committed calibration of a catalog "
        "model with the same layer shapes (layers, query/KV heads, head dim, width, MLP width and kind, "
        "attention kind, dtypes; `sim.hardware.catalog.layer_shapes`) at that (GPU, TP), with the LM head "
        "re-priced by vocabulary. Found from the catalog's shapes by `python -m sim calibrate --all --report`:",
        "",
        *[f"- {line}" for line in pair_lines()],
        "",
        "## The premise, measured",
        "",
        "Where the borrowing model has a linear-op profile of its own, its per-iteration linear time "
        "(layers x per-layer op medians + embedding) against its twin's committed curve at the same token "
        "counts:",
        "",
        "| model | twin | GPU | TP | tokens | rows | MAPE | worst | mean signed error |",
        "|---|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in premise_rows(profiles):
        lines.append(
            f"| {row['model']} | {row['twin']} | {row['gpu']} | {row['tp']} | {row['tokens']} | {row['rows']} "
            f"| {row['mape']:.1%} | {row['worst']:.1%} | {row['bias']:+.1%} |"
        )
    lines += [
        "",
        "Beyond its last profiled count a calibration extrapolates (secant slope of its upper knots); a model "
        "with a longer context than its twin's profile meets that extrapolation more often.",
        "",
        f"Profiles: {', '.join(sorted(GPU_DIRS.values()))}/mlp (Microsoft Vidur, MIT).",
    ]
    text = "\n".join(lines) + "\n"
    path = write_text(Path(report_dir) / REPORT_NAME, text, field="report-dir")
    return text, path
