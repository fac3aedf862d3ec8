"""``python -m sim calibrate-serving DIR``: fit the serving stack and a GPU step scale on a folder of real runs.

    python -m sim calibrate-serving ../shared/validation/vllm-0.11-h100
    python -m sim calibrate-serving my-runs/ --gpu l40s --engine-version 0.11.0 --server max_num_seqs=256

``DIR`` holds real benchmark results in any shape ``validate-real`` reads (bursts, load stages, server
traces: :mod:`sim.validation.folder`) and JSON files of vLLM ``benchmark_serving --save-result`` and GuideLLM
(:mod:`sim.calibration.benchmark_files`, whose servers come from their metadata, else from ``--gpu``,
``--engine-version``, ``--tensor-parallel``, ``--max-model-len`` and ``--server KEY=VALUE``). The command
replays every run under the presets, leaves out those at or above 0.9 of capacity, fits the terms the rest
identify (:func:`sim.calibration.serving_terms.default_terms`), refits without each run to predict it
(leave-one-run-out), prints the three errors side by side and writes the calibration file
(default ``results/calibration/<DIR name>_serving.yaml``) that a scenario names as ``calibration:``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sim.errors import UserError, shown

DEFAULT_OUT_DIR = Path("results") / "calibration"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``calibrate-serving`` on the ``python -m sim`` subcommands."""
    p = sub.add_parser("calibrate-serving", help="fit the serving stack and a GPU step scale on your own benchmark "
                       "results; writes a calibration file a scenario names",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("dir", help="folder of real runs: validate-real's CSV shapes, benchmark_serving or GuideLLM JSON")
    p.add_argument("--out", default=None, help=f"calibration file (default: {DEFAULT_OUT_DIR}/<DIR name>_serving.yaml)")
    p.add_argument("--gpu", default=None, help="GPU of the JSON results that do not say (python -m sim list gpus)")
    p.add_argument("--engine-version", default=None, help="vLLM version of the JSON results that do not say (0.11.0)")
    p.add_argument("--model", default=None, help="model of the JSON results, over what they say (a catalog name or "
                   "Hugging Face id)")  # fmt: skip
    p.add_argument("--tensor-parallel", type=int, default=None, help="GPUs per replica of the JSON results (default 1)")
    p.add_argument("--max-model-len", type=int, default=None, help="--max-model-len of their server (default: the "
                   "model's context window)")  # fmt: skip
    p.add_argument("--server", action="append", default=[], metavar="FLAG=VALUE", help="another server flag of the "
                   "JSON results: max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, prefix_caching, "
                   "chunked_prefill, num_scheduler_steps, kv_cache_tokens (repeatable)")  # fmt: skip
    p.add_argument("--no-leave-one-out", action="store_true", help="skip the leave-one-run-out refits (faster)")
    p.add_argument("--max-evaluations", type=int, default=40, help="most objective evaluations of the joint fit")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(handler=cmd_calibrate_serving)


def cmd_calibrate_serving(args: argparse.Namespace) -> int:
    """Check the inputs, fit, print the errors, write the file."""
    from sim.io.safe_paths import check_target, require_input_folder

    folder = require_input_folder(args.dir, "folder of real runs", field="dir")
    out = Path(args.out) if args.out else DEFAULT_OUT_DIR / f"{folder.resolve().name}_serving.yaml"
    check_target(out, field="out")
    if args.max_evaluations < 1:
        raise UserError(f"--max-evaluations = {args.max_evaluations}: must be >= 1", field="max-evaluations")
    defaults, overrides = server_defaults(args)
    log = None if args.quiet else print
    result = calibrate_serving(folder, defaults, overrides, leave_one_out=not args.no_leave_one_out,
                               max_evaluations=args.max_evaluations, log=log)  # fmt: skip
    from sim.io.serving_calibration import write_calibration

    write_calibration(result, out)
    if log:
        log(report_text(result.fitted_on))
        log(f"wrote {out}; name it in a scenario as calibration: {out}")
    return 0


def server_defaults(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(flags for JSON results that do not record them, flags over what they record) from the options."""
    from sim.io.yaml_reader import parse_option_value
    from sim.validation.server import COLUMN_NAMES

    defaults: dict[str, Any] = {"tensor_parallel": 1, "num_gpus": None}
    for key, value in (("gpu", args.gpu), ("engine_version", args.engine_version),
                       ("tensor_parallel", args.tensor_parallel), ("max_model_len", args.max_model_len)):  # fmt: skip
        if value is not None:
            defaults[key] = value
    for item in args.server:
        key, sep, text = item.partition("=")
        if not sep or key.strip() not in COLUMN_NAMES:
            raise UserError(f"--server {shown(item)}: expected FLAG=VALUE with FLAG one of {', '.join(COLUMN_NAMES)}",
                            field="server")  # fmt: skip
        defaults[key.strip()] = parse_option_value(text, f"--server {key.strip()}")
    if defaults["num_gpus"] is None:
        defaults["num_gpus"] = defaults["tensor_parallel"]
    return defaults, ({"model_id": args.model} if args.model else {})


# --------------------------------------------------------------------------- the library call
def load_calibration_cases(folder: Path, defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> list[Any]:
    """Every run of ``folder``: its CSV shapes (:func:`sim.validation.folder.load_cases`), then its JSON results
    by name (``*.pytorch.json`` companions skipped), each checked.

    Raises:
        UserError: a folder without runs, or any reader's error (naming the file and field).
    """
    from sim.calibration.benchmark_files import SKIPPED_SUFFIX, cases_of_json
    from sim.validation.folder import load_cases

    cases = load_cases(folder) if any(p.suffix.lower() == ".csv" for p in folder.iterdir()) else []
    results = [p for p in folder.iterdir() if p.suffix.lower() == ".json" and not p.name.endswith(SKIPPED_SUFFIX)]
    for path in sorted(results):
        cases += cases_of_json(path, defaults, overrides)
    if not cases:
        raise UserError(f"{folder}: no real runs: expected CSVs that validate-real reads or benchmark_serving / "
                        "GuideLLM JSON results", field="dir")  # fmt: skip
    for case in cases:
        case.check()
    return cases


def calibrate_serving(folder: Path, defaults: Mapping[str, Any] | None = None,
                      overrides: Mapping[str, Any] | None = None, *, leave_one_out: bool = True,
                      max_evaluations: int = 40, log: Callable[[str], None] | None = None) -> Any:  # fmt: skip
    """Fit a serving calibration on ``folder`` (see module); its ``fitted_on`` records the runs, the terms and the
    errors under the presets, the fit and leave-one-run-out.

    Returns:
        a :class:`sim.io.serving_calibration.ServingCalibration`.

    Raises:
        UserError: no runs, a broken file, or every run saturated (nothing measures the serving stack).
    """
    from sim.calibration import serving_fit as sf
    from sim.calibration.serving_terms import default_terms

    cases = load_calibration_cases(Path(folder), defaults or {}, overrides or {})
    kept, baseline = sf.unsaturated(cases, log=log)
    if not kept:
        raise UserError(f"{folder}: every run is at or above 0.9 of its simulated capacity; a saturated run measures "
                        "the capacity, not the serving stack: add runs at lower load", field="dir")  # fmt: skip
    terms = default_terms(kept)
    joint = sf.fit(terms, kept, max_evaluations=max_evaluations)
    if log:
        log(f"fitted {', '.join(t.name for t in terms)} on {len(kept)} runs in {joint.evaluations} replays of them")
    loo = sf.leave_one_out(terms, kept, joint, log=log) if leave_one_out and len(kept) > 1 else None
    presets = baseline[baseline["run"].isin([c.name for c in kept]) & baseline["metric"].isin(sf.FITTED_METRICS)]
    fitted = joint.residuals
    fit_errors = fitted.assign(error_pct=100 * (fitted["simulated"] / fitted["measured"] - 1))
    record: dict[str, Any] = {
        "folder": str(Path(folder).resolve().name), "command": "python -m sim calibrate-serving",
        "runs": [c.name for c in kept], "left_out_saturated": [c.name for c in cases if c not in kept],
        "terms": {t.name: {"preset": t.start, "fitted": v} for t, v in zip(terms, joint.values, strict=True)},
        "median_abs_error_pct": {
            "presets": _rounded(sf.median_abs_errors(presets)), "fit": _rounded(sf.median_abs_errors(fit_errors)),
        },
    }  # fmt: skip
    if loo is not None:
        record["median_abs_error_pct"]["leave_one_out"] = _rounded(sf.median_abs_errors(loo))
        record["leave_one_out"] = [
            {"run": r.case, "metric": r.metric, "measured": round(float(r.measured), 4),
             "predicted": round(float(r.predicted), 4), "error_pct": round(float(r.error_pct), 2)}
            for r in loo.itertuples()
        ]  # fmt: skip
    return sf.calibration_with(terms, joint.values, fitted_on=record)


SHARED_FOLDER = "vllm-0.11-h100"
"""The folder of ../shared/validation whose calibration ``python -m sim report`` writes (the README's example)."""


def write_shared_calibration(out_dir: Path, log: Callable[[str], None] = print) -> None:
    """``python -m sim report``: ``out_dir/<SHARED_FOLDER>_serving.yaml`` from ../shared/validation, or say why not."""
    from sim.io.serving_calibration import write_calibration
    from sim.validation.report import DATA_ROOT

    folder = DATA_ROOT / SHARED_FOLDER
    if not folder.is_dir():
        log(f"skipped the serving calibration: no {folder} (../shared next to the repository)")
        return
    path = Path(out_dir) / f"{SHARED_FOLDER}_serving.yaml"
    write_calibration(calibrate_serving(folder), path)
    log(f"wrote {path}")


def _rounded(errors: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in errors.items()}


def report_text(record: Mapping[str, Any]) -> str:
    """The terms (preset -> fitted) and the median |error| per figure under the presets, the fit and leave-one-out."""
    lines = [f"{'term':<24}{'preset':>10}{'fitted':>10}"]
    lines += [f"{name:<24}{t['preset']:>10g}{t['fitted']:>10g}" for name, t in record["terms"].items()]
    errors = record["median_abs_error_pct"]
    columns = list(errors)
    lines += ["", "median |error| %".ljust(24) + "".join(f"{c:>15}" for c in columns)]
    for metric in errors["presets"]:
        lines.append(f"{metric:<24}" + "".join(f"{errors[c].get(metric, float('nan')):>15.1f}" for c in columns))
    return "\n".join(lines)
