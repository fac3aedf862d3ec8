"""The measured server of a real run, and the batchsim policy that stands for it.

Every shape of validation data records (in its columns or, where its files do not, in its
folder's README) the server it measured: the vLLM version, the model and GPU, and the
flags that shape batching (``--max-num-seqs``, ``--max-num-batched-tokens``,
``--max-model-len``, ``--gpu-memory-utilization``, prefix caching and chunked prefill on or
off, ``--num-scheduler-steps``). :class:`ServerFlags` holds them; :func:`read_server_flags`
reads them from a row, a column that is absent taking the shape's documented default;
:func:`policy_entry` turns them into one policy: the preset of the engine version
(:data:`ENGINE_PRESETS`, the one table to change when a version gets its own preset) with
every recorded flag as an explicit field, so the preset's defaults apply only to what the
run did not record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.errors import UserError, did_you_mean, shown
from sim.io.csv_reader import where

ENGINE_PRESETS: dict[str, str] = {
    "0.6": "vllm-0.6",
    "0.11": "vllm-0.11",
}
"""vLLM major.minor version of a measured server -> the batchsim preset that replays it."""

MODELS: dict[str, str] = {
    "meta-llama/Meta-Llama-3-8B-Instruct": "llama-3-8b",
    "mistralai/Mistral-7B-Instruct-v0.3": "mistral-7b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
}
"""Hugging Face id of a measured model -> batchsim catalog model of the same shape."""

GPUS: dict[str, str] = {
    "A100-80GB-SXM": "a100-80gb",
    "H100-80GB-SXM": "h100-sxm",
    "H100-80GB (GKE nvidia-h100-80gb)": "h100-sxm",  # GKE A3: H100 SXM (vllm-0.11-h100/README.md)
}
"""GPU name in a validation file -> batchsim catalog GPU."""

BUDGET_FIELD: dict[str, str] = {"paged": "max_num_batched_tokens", "chunked_prefill": "chunk_size"}
"""Policy kind -> the field that holds vLLM's ``max_num_batched_tokens``."""

BLOCK_SIZE_TOKENS = 16
"""vLLM's default KV block size, that of every run in ../shared/validation."""


@dataclass(frozen=True)
class ServerFlags:
    """What a real run's server was. ``None``: not recorded (the preset's default applies).

    Attributes:
        engine_version: vLLM version, e.g. ``0.11.0``.
        model_id: Hugging Face id of the model served.
        gpu: GPU name as the data writes it.
        tensor_parallel: GPUs per replica.
        num_gpus: GPUs in all.
        max_model_len: ``--max-model-len``.
        max_num_seqs: ``--max-num-seqs``.
        max_num_batched_tokens: ``--max-num-batched-tokens``.
        gpu_memory_utilization: ``--gpu-memory-utilization``.
        prefix_caching: automatic prefix caching on or off.
        chunked_prefill: chunked prefill on or off.
        num_scheduler_steps: ``--num-scheduler-steps`` (vLLM 0.6 multi-step).
        kv_cache_tokens: the KV cache size the server's log printed (pins batchsim's KV budget).
    """

    engine_version: str
    model_id: str
    gpu: str
    max_model_len: int
    tensor_parallel: int = 1
    num_gpus: int = 1
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    prefix_caching: bool | None = None
    chunked_prefill: bool | None = None
    num_scheduler_steps: int | None = None
    kv_cache_tokens: int | None = None


COLUMN_NAMES: dict[str, tuple[str, ...]] = {
    "engine_version": ("engine_version",), "model_id": ("model_id",), "gpu": ("gpu",),
    "max_model_len": ("max_model_len",), "tensor_parallel": ("tensor_parallel", "tp"), "num_gpus": ("num_gpus",),
    "max_num_seqs": ("max_num_seqs",), "max_num_batched_tokens": ("max_num_batched_tokens",),
    "gpu_memory_utilization": ("gpu_memory_utilization",), "prefix_caching": ("prefix_caching",),
    "chunked_prefill": ("chunked_prefill",), "num_scheduler_steps": ("num_scheduler_steps",),
    "kv_cache_tokens": ("kv_cache_tokens",),
}  # fmt: skip
"""ServerFlags field -> the columns that may hold it, first found wins."""
_WHOLE = ("max_model_len", "tensor_parallel", "num_gpus", "max_num_seqs", "max_num_batched_tokens",
          "num_scheduler_steps", "kv_cache_tokens")  # fmt: skip
_SWITCHES = ("prefix_caching", "chunked_prefill")
_TEXT = ("engine_version", "model_id", "gpu")


def read_server_flags(frame: pd.DataFrame, row: int, path: Path, defaults: dict[str, Any]) -> ServerFlags:
    """The server of data row ``row``: each flag from its column where the file has one, else ``defaults``.

    A cell reading ``not set ...`` (or empty) leaves the flag unrecorded (None); ``on``/``off``,
    ``true``/``false`` (first word, any case) are the switches.

    Raises:
        UserError: naming file, line and column: a cell that is not a whole number >= 1, a
            fraction in (0, 1] or a switch; or a required flag (version, model, GPU,
            max_model_len) that neither the file nor the defaults give.
    """
    values = dict(defaults)
    for name, columns in COLUMN_NAMES.items():
        column = next((c for c in columns if c in frame.columns), None)
        if column is not None:
            values[name] = _cell_value(name, frame[column].iloc[row], where(path, row, column))
    missing = [n for n in ("engine_version", "model_id", "gpu", "max_model_len") if values.get(n) is None]
    if missing:
        raise UserError(f"{path}: no column '{missing[0]}' and no documented default for it")
    return ServerFlags(**{k: v for k, v in values.items() if v is not None})


def _cell_value(name: str, cell: Any, location: str) -> Any:
    text = "" if pd.isna(cell) else str(cell).strip()
    if not text or text.lower().startswith("not set"):
        return None
    if name in _TEXT:
        return text
    if name in _SWITCHES:
        word = text.split()[0].lower()
        if word in ("on", "true"):
            return True
        if word in ("off", "false"):
            return False
        raise UserError(f"{location}: value {shown(text)} is not a switch; allowed: on, off, true, false")
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if name in _WHOLE:
        if not (np.isfinite(number) and number >= 1 and number == int(number)):
            raise UserError(f"{location}: value {shown(text)} is not a whole number >= 1")
        return int(number)
    if not (np.isfinite(number) and 0 < number <= 1):  # gpu_memory_utilization
        raise UserError(f"{location}: value {shown(text)} is not a fraction in (0, 1]")
    return number


# --------------------------------------------------------------------------- to batchsim
def preset_for(engine_version: str) -> str:
    """The batchsim preset of a vLLM version (``0.11.0`` -> ``ENGINE_PRESETS['0.11']``).

    Raises:
        UserError: a version without a preset.
    """
    key = ".".join(str(engine_version).lstrip("v").split(".")[:2])
    if key not in ENGINE_PRESETS:
        raise UserError(
            f"engine_version {shown(engine_version)}: no batchsim preset for vLLM {key}"
            f"{did_you_mean(key, ENGINE_PRESETS)}; known: {', '.join(ENGINE_PRESETS)}"
        )
    return ENGINE_PRESETS[key]


def catalog_names(flags: ServerFlags, run: str) -> tuple[str, str]:
    """The batchsim (model, gpu) of a run's server: :data:`MODELS` and :data:`GPUS` first, then any catalog
    model by its name or Hugging Face id and any catalog GPU by its name (a user's own runs name them so).

    Raises:
        UserError: a model or GPU without a mapping.
    """
    from sim.hardware.catalog import GPUS as CATALOG_GPUS
    from sim.hardware.catalog import MODELS as CATALOG_MODELS

    by_hf = {spec.hf_name: name for name, spec in CATALOG_MODELS.items()}
    model = MODELS.get(flags.model_id) or (flags.model_id if flags.model_id in CATALOG_MODELS else None)
    model = model or by_hf.get(flags.model_id)
    if model is None:
        raise UserError(
            f"run {shown(run)}: model_id {shown(flags.model_id)} has no batchsim model"
            f"{did_you_mean(flags.model_id, [*MODELS, *CATALOG_MODELS])}; known: {', '.join(MODELS)} or a catalog "
            "model's name or Hugging Face id (python -m sim list models)"
        )
    gpu = GPUS.get(flags.gpu) or (flags.gpu if flags.gpu in CATALOG_GPUS else None)
    if gpu is None:
        raise UserError(
            f"run {shown(run)}: gpu {shown(flags.gpu)} has no batchsim GPU"
            f"{did_you_mean(flags.gpu, [*GPUS, *CATALOG_GPUS])}; known: {', '.join(GPUS)} or a catalog GPU "
            "(python -m sim list gpus)"
        )
    return model, gpu


def policy_entry(flags: ServerFlags, name: str, run: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The policy that replays ``flags``'s server, and notes on flags batchsim cannot express.

    Returns:
        (policy entry as a scenario's ``policies[]`` takes it, notes).

    Raises:
        UserError: an unknown engine version, model or GPU, or chunked prefill on for a
            preset without it.
    """
    from sim.hardware.catalog import GPUS as CATALOG_GPUS
    from sim.presets import DeploymentFacts, expand_preset

    preset = preset_for(flags.engine_version)
    _, gpu = catalog_names(flags, run)
    facts = DeploymentFacts(gpu, float(CATALOG_GPUS[gpu].memory_gb), flags.max_model_len)
    entry: dict[str, Any] = {"name": name, "preset": preset}
    kind = expand_preset(dict(entry), facts)["kind"]  # the kind the preset resolves to on this deployment
    explicit = {
        "max_batch_size": flags.max_num_seqs,
        BUDGET_FIELD.get(kind, "max_num_batched_tokens"): flags.max_num_batched_tokens,
        "gpu_memory_utilization": flags.gpu_memory_utilization,
        "prefix_caching": flags.prefix_caching,
        "num_scheduler_steps": flags.num_scheduler_steps,
    }
    entry |= {k: v for k, v in explicit.items() if v is not None}
    return entry, _chunking_notes(kind, flags, preset, run)


def _chunking_notes(kind: str, flags: ServerFlags, preset: str, run: str) -> tuple[str, ...]:
    chunked = flags.chunked_prefill
    if chunked is None or chunked == (kind == "chunked_prefill"):
        return ()
    if chunked:
        raise UserError(f"run {shown(run)}: chunked prefill on, but preset {preset} (kind {kind!r}) never chunks")
    if preset in CHUNKING_FLAG_IGNORED:  # the server chunked whatever the flag said: replayed as it ran
        why = CHUNKING_FLAG_IGNORED[preset]
        return (f"--no-enable-chunked-prefill was ignored by {preset} ({why}): replayed chunked",)
    return (f"chunked prefill off is not expressible for preset {preset} (kind {kind!r}); replayed chunked",)


CHUNKING_FLAG_IGNORED: dict[str, str] = {
    "vllm-0.11": "vllm-project/vllm vllm/engine/arg_utils.py at v0.11.0: the V1 engine forces chunked prefill; "
    "the flag is honoured from v0.11.1",
}
"""Presets whose engine version ran chunked prefill even with ``--no-enable-chunked-prefill`` (docs/presets.md)."""


def memory_block(flags: ServerFlags) -> dict[str, Any]:
    """The scenario's ``memory`` block: 16-token blocks, the server's memory share, a pinned KV size if logged."""
    block: dict[str, Any] = {"block_size": BLOCK_SIZE_TOKENS}
    if flags.gpu_memory_utilization is not None:
        block["gpu_memory_utilization"] = flags.gpu_memory_utilization
    if flags.kv_cache_tokens is not None:
        block["kv_blocks"] = flags.kv_cache_tokens // BLOCK_SIZE_TOKENS
    return block
