"""A serving calibration file: the serving-stack terms and GPU-time scales fitted on a user's real runs.

``python -m sim calibrate-serving DIR`` (:mod:`sim.calibration.serving_cli`) writes one; a scenario
names it (``calibration: path``), and its terms then override the presets' (docs/uncertainty.md):

.. code-block:: yaml

    format: batchsim-serving-calibration/1
    batchsim_version: ...
    serving:                      # by engine generation (a preset's ``generation``)
      v1:
        frontend: {per_request_ms: 3.4, latency_ms: 15.2}
        engine_cpu: {pass_ms: 0.14, step_us_per_seq: 12.1}
    step_scale: {h100-sxm: 1.02}   # GPU time x this, per catalog GPU
    fitted_on: ...                 # provenance and the leave-one-run-out errors (free-form, kept as written)

:func:`read_calibration` checks every term (a known generation, block and field, a finite number in the
field's range) and :func:`write_calibration` writes a file that reads back equal. :func:`calibrated_raw`
applies a calibration to a raw scenario mapping before validation, as the presets are applied: the terms of
each preset's generation replace the preset's (a block the policy sets itself still wins), and the scale of
the scenario's GPU becomes ``cost.step_scale`` unless the scenario sets one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sim.errors import UserError, did_you_mean, shown
from sim.io.yaml_reader import read_yaml_file

FORMAT = "batchsim-serving-calibration/1"
GENERATIONS = ("v0", "v1")
"""Engine generations a file may hold terms for (:attr:`sim.presets.Preset.generation`)."""
TERM_LIMITS: dict[str, dict[str, float]] = {
    "frontend": {"per_request_ms": 10_000, "per_prompt_token_us": 10_000, "latency_ms": 1e10},
    "engine_cpu": {"step_ms": 1000, "step_us_per_seq": 10_000, "pass_ms": 1000, "pass_us_per_seq": 10_000},
}
"""Block -> fitted field -> its upper bound (each >= 0), as the scenario schema bounds the same fields
(:class:`sim.config.FrontendConfig`, :class:`sim.config.EngineCPUConfig`)."""
MAX_STEP_SCALE = 100.0
"""Largest GPU time scale (as ``cost.step_scale`` allows)."""
FIELD = "calibration"


@dataclass(frozen=True)
class ServingCalibration:
    """What a serving calibration file holds.

    Attributes:
        serving: generation -> block (``frontend``, ``engine_cpu``) -> field -> value.
        step_scale: catalog GPU -> factor on its GPU time.
        fitted_on: provenance and errors, as written (free-form mapping).
    """

    serving: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    step_scale: dict[str, float] = field(default_factory=dict)
    fitted_on: dict[str, Any] = field(default_factory=dict)

    def to_document(self) -> dict[str, Any]:
        """The YAML document of this calibration."""
        from sim.version import __version__

        return {
            "format": FORMAT, "batchsim_version": __version__,
            "serving": {g: {b: dict(t) for b, t in blocks.items()} for g, blocks in self.serving.items()},
            "step_scale": dict(self.step_scale), "fitted_on": self.fitted_on,
        }  # fmt: skip

    @classmethod
    def from_document(cls, document: Any, source: str) -> ServingCalibration:
        """Check a parsed file.

        Raises:
            UserError: naming the file and the field: not a mapping, another format, an unknown
                generation, block, term or GPU, or a value that is not a number in its range.
        """
        if not isinstance(document, Mapping):
            raise UserError(f"{source}: not a serving calibration (a YAML mapping with format: {FORMAT})", FIELD)
        if document.get("format") != FORMAT:
            raise UserError(f"{source}: format = {shown(document.get('format'))}; expected {FORMAT!r}", FIELD)
        serving = _serving(document.get("serving") or {}, source)
        scales = _scales(document.get("step_scale") or {}, source)
        fitted_on = document.get("fitted_on") or {}
        if not isinstance(fitted_on, Mapping):
            raise UserError(f"{source}: fitted_on = {shown(fitted_on)}: must be a mapping", FIELD)
        return cls(serving, scales, dict(fitted_on))


def _serving(serving: Any, source: str) -> dict[str, dict[str, dict[str, float]]]:
    checked: dict[str, dict[str, dict[str, float]]] = {}
    for generation, blocks in _mapping(serving, f"{source}: serving").items():
        if generation not in GENERATIONS:
            raise UserError(
                f"{source}: serving.{generation}: unknown engine generation{did_you_mean(str(generation), GENERATIONS)}"
                f"; allowed: {', '.join(GENERATIONS)}",
                FIELD,
            )
        checked[generation] = {}
        for block, terms in _mapping(blocks, f"{source}: serving.{generation}").items():
            if block not in TERM_LIMITS:
                raise UserError(f"{source}: serving.{generation}.{block}: unknown block; allowed: "
                                f"{', '.join(TERM_LIMITS)}", FIELD)  # fmt: skip
            where = f"serving.{generation}.{block}"
            checked[generation][block] = {
                name: _number(value, f"{source}: {where}.{name}", 0.0, _limit(block, name, source, where))
                for name, value in _mapping(terms, f"{source}: {where}").items()
            }
    return checked


def _scales(scales: Any, source: str) -> dict[str, float]:
    from sim.hardware.catalog import GPUS

    checked = {}
    for gpu, value in _mapping(scales, f"{source}: step_scale").items():
        if gpu not in GPUS:
            raise UserError(f"{source}: step_scale.{gpu}: unknown GPU{did_you_mean(str(gpu), GPUS)} "
                            "(python -m sim list gpus)", FIELD)  # fmt: skip
        checked[str(gpu)] = _number(value, f"{source}: step_scale.{gpu}", 0.0, MAX_STEP_SCALE, open_low=True)
    return checked


def _limit(block: str, name: str, source: str, where: str) -> float:
    limits = TERM_LIMITS[block]
    if name not in limits:
        raise UserError(f"{source}: {where}.{name}: unknown term{did_you_mean(str(name), limits)}; allowed: "
                        f"{', '.join(limits)}", FIELD)  # fmt: skip
    return limits[name]


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise UserError(f"{where} = {shown(value)}: must be a mapping", FIELD)
    return value


def _number(value: Any, where: str, low: float, high: float, *, open_low: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if open_low else value >= low) and value <= high
    if not ok:
        bound = f"> {low:g}" if open_low else f">= {low:g}"
        raise UserError(f"{where} = {shown(value)}: must be a number {bound} and <= {high:g}", FIELD)
    return float(value)


# --------------------------------------------------------------------------- files
def read_calibration(path: str | Path) -> ServingCalibration:
    """Read and check a serving calibration file.

    Raises:
        UserError: (field ``calibration``) a missing or unreadable file, not YAML, or any check of
            :meth:`ServingCalibration.from_document`.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{shown(str(path))}: no such file (a serving calibration from python -m sim "
                        "calibrate-serving)", FIELD)  # fmt: skip
    try:
        document = read_yaml_file(path, what="serving calibration")
    except UserError as exc:
        raise UserError(str(exc), FIELD) from None
    return ServingCalibration.from_document(document, str(path))


def write_calibration(calibration: ServingCalibration, path: str | Path) -> None:
    """Write ``calibration`` as YAML (atomically)."""
    from sim.io.safe_write import atomic_file

    text = yaml.safe_dump(calibration.to_document(), sort_keys=False, width=120)
    with atomic_file(Path(path)) as tmp:
        tmp.write_text(text)


def resolve_calibration_path(path: str, base_dir: str | Path | None) -> str:
    """``path`` as written, or made absolute against the scenario's folder when it is relative and found there
    (else it stays relative to the working directory, like a trace path)."""
    candidate = Path(os.path.expanduser(path))
    if candidate.is_absolute() or base_dir is None:
        return str(candidate)
    beside = Path(base_dir) / candidate
    return str(beside.resolve()) if beside.is_file() else str(candidate)


# --------------------------------------------------------------------------- applying
def calibrated_raw(data: dict[str, Any]) -> tuple[dict[str, Any], Mapping[str, Any] | None]:
    """A raw scenario with its ``calibration`` file applied to ``cost``, and the serving terms the presets take.

    Returns:
        (the scenario mapping with ``cost.step_scale`` set from the file for the scenario's GPU unless the
        scenario sets it, the file's ``serving`` terms by generation); (data, None) without a calibration.

    Raises:
        UserError: the file fails :func:`read_calibration`.
    """
    path = data.get("calibration")
    if not isinstance(path, str) or not path:  # absent, or malformed: the schema reports it
        return data, None
    calibration = read_calibration(path)
    gpu = data.get("gpu", "a100-80gb")
    cost = data.get("cost")
    if gpu in calibration.step_scale and (cost is None or isinstance(cost, Mapping)):
        cost = dict(cost or {})
        cost.setdefault("step_scale", calibration.step_scale[gpu])
        data = {**data, "cost": cost}
    return data, calibration.serving
