"""Where a run finds its calibrations, and how it reads them.

The committed files live in ``sim/hardware/calibrations/``: one per (model, GPU, TP) plus
one roofline (transfer) file per profiled GPU. The offline pipeline that writes them is
:mod:`sim.calibration`; a run only reads, so this module needs YAML (read within the size and alias budget of
:mod:`sim.io.yaml_reader`) and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import UserError
from sim.io.yaml_reader import read_yaml_file

CALIBRATION_DIR = Path(__file__).resolve().parent / "calibrations"
ROOFLINE_FILE = "a100-80gb_roofline.yaml"
LICENCE = "derived from Microsoft Vidur A100 profiles (MIT)"
# batchsim GPU name -> folder of its profiles under ../shared/profiles/
GPU_DIRS: dict[str, str] = {"a100-80gb": "a100", "h100-sxm": "h100", "a40": "a40"}

# Coefficient names of the attention forms, in the order of the fitted feature columns.
DECODE_TERMS = ("launch_ms", "per_seq_ms", "per_kv_token_ms")
PREFILL_TERMS = ("launch_ms", "per_token_ms", "per_work_ms", "per_sq_token_ms")


def calibration_filename(model: str, gpu: str, tp: int) -> str:
    """File name of the calibration of (model, GPU, TP), e.g. ``llama-2-7b_a100-80gb_tp1.yaml``."""
    return f"{model}_{gpu}_tp{tp}.yaml"


def roofline_file_name(gpu: str) -> str:
    """The per-GPU roofline (transfer) file, e.g. ``h100-sxm_roofline.yaml``."""
    return f"{gpu}_roofline.yaml"


def read_yaml(path: str | Path) -> dict:
    """Read a calibration or roofline file.

    Raises:
        UserError: missing file, invalid YAML, or not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"calibration file not found: {path}")
    data = read_yaml_file(path, what="calibration file")
    if not isinstance(data, dict) or "format" not in data:
        raise UserError(f"{path}: not a batchsim calibration file (no 'format' key)")
    return data
