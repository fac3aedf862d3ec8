"""``python -m sim calibrate``: fit calibration files from the A100, H100 and A40 profiles.

    python -m sim calibrate --profiles ../shared/profiles --model llama-2-7b \\
        --gpu a100-80gb --tp 1 --out /tmp/llama-2-7b_a100-80gb_tp1.yaml --report
    python -m sim calibrate --all [--report]    # regenerate every committed file
    python -m sim calibrate --all --gpu a40     # only one GPU's files

On H100 (``h100-sxm``) and A40 (``a40``), ``--all`` fits every profiled (model, TP) whose
weights fit the GPU's memory and prints a line for each one skipped.

``--report`` prints the held-out fit errors and saves Markdown + PNG fit reports (and,
with ``--all``, the leave-one-model-out transfer report, ``same_shape.md`` (the models that use a
same-shape model's calibration, found from the catalog's layer shapes) and, when the H100 is
fitted, ``h100_prefill.md`` (TP1 prefill against its profiles)) into ``--report-dir``.
A model with a same-shape model's calibration on that (GPU, TP) is not calibrated a second time
(``--out`` writes one elsewhere).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from sim.errors import UserError
from sim.hardware.calibration_files import (
    CALIBRATION_DIR,
    GPU_DIRS,
    ROOFLINE_FILE,
    calibration_filename,
    roofline_file_name,
)

if TYPE_CHECKING:  # the fitting modules need pandas and scipy: loaded by the command, not by --help
    from sim.calibration.profiles import ProfileSet

PROFILED_GPU = "a100-80gb"

DEFAULT_PROFILES = "../shared/profiles"
DEFAULT_REPORT_DIR = "results/calibration"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``calibrate`` subcommand on ``subparsers``."""
    parser = subparsers.add_parser(
        "calibrate",
        help="fit cost-model calibrations from A100/H100/A40 profiles",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profiles",
        default=DEFAULT_PROFILES,
        help=f"folder holding a100/ (default {DEFAULT_PROFILES})",
    )
    parser.add_argument("--model", help="model name, e.g. llama-2-7b")
    parser.add_argument(
        "--gpu",
        help="GPU the profiles were measured on: a100-80gb (default), h100-sxm or a40; "
        "with --all, only that GPU's files (default: every profiled GPU)",
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    parser.add_argument("--out", help="calibration YAML to write (default: the committed file's path)")
    parser.add_argument(
        "--all",
        action="store_true",
        help="regenerate every committed calibration and the roofline transfer file",
    )
    parser.add_argument("--report", action="store_true", help="print and save fit reports (Markdown + PNG)")
    parser.add_argument(
        "--report-dir",
        default=DEFAULT_REPORT_DIR,
        help=f"where fit reports go (default {DEFAULT_REPORT_DIR})",
    )


def run(args: argparse.Namespace) -> int:
    """Run the ``calibrate`` subcommand; returns the exit code.

    Raises:
        UserError: missing --model without --all, or anything the fit rejects.
    """
    from sim.calibration.profiles import ProfileSet

    profiles = ProfileSet(args.profiles)
    if args.all:
        return _run_all(profiles, args)
    if not args.model:
        raise UserError("give --model (or --all to regenerate every committed calibration)", field="model")
    gpu = args.gpu or PROFILED_GPU
    if not args.out:
        _refuse_duplicate(args.model, gpu, args.tp)
    out = Path(args.out) if args.out else CALIBRATION_DIR / calibration_filename(args.model, gpu, args.tp)
    _check_out_file(out)
    _calibrate_one(profiles, args.model, gpu, args.tp, out, args)
    return 0


def _refuse_duplicate(model: str, gpu: str, tp: int) -> None:
    """Refuse to commit a second calibration of layer shapes already calibrated on (GPU, TP).

    Raises:
        UserError: ``model`` prices itself with a same-shape model's committed file there.
    """
    from sim.hardware.catalog import get_gpu, get_model
    from sim.hardware.same_shape import twin_for

    spec = get_model(model)
    get_gpu(gpu)
    twin = twin_for(spec, gpu, tp)
    if twin is not None:
        raise UserError(
            f"'{model}' has the layer shapes of {twin}, whose calibration "
            f"{calibration_filename(twin, gpu, tp)} it uses (same-shape); a second one would duplicate it: "
            "give --out to write it elsewhere",
            field="model",
        )


def _check_out_file(out: Path) -> None:
    """Refuse an --out that is not a new path or a regular file (a folder, a device, a path under
    a file, ...: :func:`sim.io.safe_paths.check_target`), before fitting anything."""
    from sim.io.safe_paths import check_target

    check_target(out, field="out")


def _calibrate_one(profiles: ProfileSet, model: str, gpu: str, tp: int, out: Path, args: argparse.Namespace) -> None:
    from sim.calibration import calibrate

    data = calibrate.calibrate(profiles, model, gpu, tp)
    print(f"wrote {calibrate.write_yaml(data, out)}")
    if args.report:
        _report_one(profiles, model, gpu, tp, args)


def _report_one(profiles: ProfileSet, model: str, gpu: str, tp: int, args: argparse.Namespace) -> None:
    from sim.calibration import fit_report  # matplotlib: only when a report is asked for
    from sim.calibration.profiles import ProfileSet
    from sim.calibration.same_shape_report import pair_lines

    text, md, png = fit_report.calibration_report(ProfileSet(profiles.root, gpu), model, tp, args.report_dir)
    print(text)
    print(f"saved {md} and {png}")
    for line in pair_lines(involving=model):
        print(line)


def _fit_gpu(profiles: ProfileSet, gpu: str) -> list[tuple[Path, dict, tuple[str, int] | None]]:
    """Every file of ``gpu`` fitted and checked, nothing written: (path, content, (model, TP) or None)."""
    from sim.calibration import calibrate, gpu_roofline

    if gpu not in GPU_DIRS:
        raise UserError(f"--gpu = '{gpu}': no profiles; profiled: {', '.join(GPU_DIRS)}", field="gpu")
    if gpu == PROFILED_GPU:
        roof = calibrate.fit_roofline_file(profiles)
        path = CALIBRATION_DIR / ROOFLINE_FILE
    else:
        roof = gpu_roofline.fit_gpu_roofline_file(profiles.root, gpu)
        path = CALIBRATION_DIR / roofline_file_name(gpu)
    fitted: list[tuple[Path, dict, tuple[str, int] | None]] = [(path, roof, None)]
    kept, skipped = calibrate.committed_configs(profiles, gpu)
    for line in skipped:
        print(line)
    for model, tp in kept:
        out = CALIBRATION_DIR / calibration_filename(model, gpu, tp)
        fitted.append((out, calibrate.calibrate(profiles, model, gpu, tp), (model, tp)))
    return fitted


def _run_all(profiles: ProfileSet, args: argparse.Namespace) -> int:
    """Fit every file of every GPU first, then write them: a fit that fails leaves every file as it was."""
    from sim.calibration import calibrate
    from sim.calibration.profiles import ProfileSet

    gpus = [args.gpu] if args.gpu else list(GPU_DIRS)
    fitted = {gpu: _fit_gpu(profiles, gpu) for gpu in gpus}
    for files in fitted.values():
        for path, data, _ in files:
            print(f"wrote {calibrate.write_yaml(data, path)}")
    if not args.report:
        return 0
    from sim.calibration import fit_report

    for gpu, files in fitted.items():
        for model, tp in (config for _, _, config in files if config is not None):
            _report_one(profiles, model, gpu, tp, args)
    for gpu in gpus:
        text, md, png = fit_report.transfer_report(ProfileSet(profiles.root, gpu), args.report_dir)
        print(text)
        print(f"saved {md} and {png}")
    from sim.calibration.prefill_report import GPU as PREFILL_GPU
    from sim.calibration.prefill_report import prefill_report
    from sim.calibration.same_shape_report import same_shape_report

    reports = [same_shape_report(profiles, args.report_dir)]
    if PREFILL_GPU in gpus:
        reports.append(prefill_report(profiles, args.report_dir))
    for text, md in reports:
        print(text)
        print(f"saved {md}")
    return 0
