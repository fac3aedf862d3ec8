"""Same-shape calibration: a model whose transformer layers are a calibrated model's.

Llama-3-70B and Llama-3.1-70B run Llama-2-70B's layers (80 layers, 64 query / 8 KV heads of 128, width
8192, gated MLP 28672); Llama-3.1-8B and Mistral-7B run Llama-3-8B's. Every per-layer kernel then sees
the same matrices, so the twin's calibration prices them exactly as measured: linear ops, attention,
all-reduce (message = tokens x hidden) and the CPU time of a model that size. What the vocabulary changes
is re-priced:

* LM head: the calibration estimates it as the twin's measured up-projection x vocab / up-projection width
  (:func:`sim.calibration.fitting.lm_head_points`), so for the same layers it scales by exactly
  vocab / twin vocab.
* Embedding: kept. It gathers T rows of ``hidden`` values whatever the vocabulary: on the A100 profiles
  Llama-3-70B (128,256 tokens) and Llama-2-70B (32,000) measure the same ``emb`` time (median ratio 1.015
  over 1,036 shared (TP, tokens) rows, the same as the layer ops' 1.000-1.016: two profiling sessions).

The context length and RoPE scaling (Llama-3.1) change no kernel time: the rotary kernel applies a cos/sin
table built once at load. What decides "same shape" is :func:`sim.hardware.catalog.layer_shapes`.
"""

from __future__ import annotations

import copy
from pathlib import Path

from sim.hardware.calibration_files import CALIBRATION_DIR, LICENCE, calibration_filename, read_yaml
from sim.hardware.catalog import MODELS, ModelSpec, layer_shapes

LABEL = "same-shape ({twin})"


def same_shape_models(model: ModelSpec) -> list[str]:
    """Catalog models other than ``model`` with its layer shapes, sorted by name."""
    shapes = layer_shapes(model)
    return sorted(name for name, spec in MODELS.items() if name != model.name and layer_shapes(spec) == shapes)


def twin_for(model: ModelSpec, gpu: str, tensor_parallel: int) -> str | None:
    """The model whose committed calibration ``model`` borrows on (``gpu``, ``tensor_parallel``), or None.

    None when ``model`` has a calibration of its own there or no same-shape model has one. The committed set
    never holds two calibrations of one shape on one (GPU, TP) (``calibrate`` refuses a second), so at most
    one candidate exists; the first by name is taken should a hand-made file add another.
    """
    if _calibration_path(model.name, gpu, tensor_parallel).is_file():
        return None
    for name in same_shape_models(model):
        if _calibration_path(name, gpu, tensor_parallel).is_file():
            return name
    return None


def same_shape_configs(calibrated: list[tuple[str, str, int]]) -> list[tuple[str, str, str, int]]:
    """(model, twin, GPU, TP) for every catalog model priced by a twin's calibration.

    Args:
        calibrated: the committed (model, GPU, TP) triples
            (:func:`sim.hardware.cost_model.calibrated_configs`).
    """
    own = set(calibrated)
    found = []
    for twin, gpu, tp in calibrated:
        for name in same_shape_models(MODELS[twin]):
            if (name, gpu, tp) not in own:
                found.append((name, twin, gpu, tp))
    return sorted(found)


def load_same_shape(model: ModelSpec, gpu: str, tensor_parallel: int) -> tuple[dict, str, str, Path] | None:
    """The calibration of ``model`` built from a same-shape twin's committed file, or None.

    Returns:
        (calibration dict, label ``same-shape (<twin>)``, provenance line, the twin's file), or None when
        :func:`twin_for` finds no twin.

    Raises:
        UserError: the twin's file cannot be read.
    """
    twin = twin_for(model, gpu, tensor_parallel)
    if twin is None:
        return None
    path = _calibration_path(twin, gpu, tensor_parallel)
    twin_data = read_yaml(path)
    data = same_shape_calibration(twin_data, model, MODELS[twin])
    source = (
        f"{path.name} (same layer shapes as {twin}; LM head re-priced for {model.vocab_size:,} tokens; "
        f"{twin_data.get('source', LICENCE)})"
    )
    return data, LABEL.format(twin=twin), source, path


def same_shape_calibration(twin_data: dict, model: ModelSpec, twin: ModelSpec) -> dict:
    """``twin``'s calibration carried to ``model``: every layer term as is, the LM head x vocab ratio.

    Args:
        twin_data: the twin's calibration file content (left unchanged).
        model: the model to price; its layer shapes must equal ``twin``'s.
        twin: the calibrated model.

    Raises:
        ValueError: the layer shapes differ (a programming error: :func:`twin_for` chooses the twin).
    """
    if layer_shapes(model) != layer_shapes(twin):
        raise ValueError(f"{model.name} and {twin.name} differ in layer shapes")
    data = copy.deepcopy(twin_data)
    ratio = model.vocab_size / twin.vocab_size
    lm_head = data["lm_head"]
    lm_head["ms"] = [ms * ratio for ms in lm_head["ms"]]
    lm_head["note"] = (
        f"{twin.name}'s LM head x {model.vocab_size} / {twin.vocab_size} vocabulary rows (same hidden size, "
        f"so FLOPs and weight bytes scale by that ratio); {lm_head.get('note', '')}"
    )
    data["model"] = model.name
    data["same_shape"] = {"twin": twin.name, "vocab_ratio": ratio}
    return data


def _calibration_path(model: str, gpu: str, tensor_parallel: int) -> Path:
    return CALIBRATION_DIR / calibration_filename(model, gpu, tensor_parallel)
