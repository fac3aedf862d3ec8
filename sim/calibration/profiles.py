"""Reading Vidur's A100 (and H100, A40 linear-op) profile CSVs into tidy tables (milliseconds throughout).

Only the fitting code reads these; the simulator itself loads the committed calibration
files. Every loader checks, as it reads, that its file exists, has the columns it needs,
holds a finite number of the right kind in every cell it uses (whole counts, positive kernel
times) and enough rows for each fit, and raises :class:`UserError` naming the file, line,
column and cell otherwise. Rows measured twice at the same point (the MLP profiles repeat
2048 and 4096 tokens) are merged by averaging their medians.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.calibration.fitting import FIT_MIN_MS
from sim.errors import UserError
from sim.hardware.calibration_files import DECODE_TERMS, GPU_DIRS, LICENCE, PREFILL_TERMS
from sim.hardware.roofline import LAYER_OPS
from sim.io.csv_reader import cell_text, number_column, read_csv, require_columns, where

# batchsim name -> stem of a100/mlp/<stem>.csv
MLP_PROFILES: dict[str, str] = {
    "llama-2-7b": "meta-llama_Llama-2-7b-hf",
    "llama-2-70b": "meta-llama_Llama-2-70b-hf",
    "llama-3-8b": "meta-llama_Meta-Llama-3-8B",
    "llama-3-70b": "meta-llama_Meta-Llama-3-70B",
    "codellama-34b": "codellama_CodeLlama-34b-Instruct-hf",
    "phi-2": "microsoft_phi-2",
}
# Profiled on every GPU but outside the A100 roofline fit (kept to the six above, so the
# committed roofline file does not change): batchsim name -> stem of <gpu>/mlp/<stem>.csv
EXTRA_MLP_PROFILES: dict[str, str] = {
    "internlm-20b": "internlm_internlm-20b",
    "qwen-72b": "Qwen_Qwen-72B",
}
# batchsim GPU -> folder of its profiles; only the A100 has attention and CPU profiles.
GPU_TITLES: dict[str, str] = {"a100-80gb": "A100-80GB", "h100-sxm": "H100-80GB", "a40": "A40-48GB"}
# batchsim name -> model_name in cpu_overheads.csv (catalog models only)
CPU_PROFILES: dict[str, str] = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "phi-2": "microsoft/phi-2",
    "codellama-34b": "codellama/CodeLlama-34b-Instruct-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
}
CPU_PARTS = (
    "schedule_median",
    "prepare_inputs_e2e_median",
    "sampler_e2e_median",
    "process_model_outputs_median",
)
# What a profile cell may hold (keywords of sim.io.csv_reader.number_column): a count (tokens,
# GPUs, sequences, bytes), a size that may be 0 (cached tokens), a kernel's median time (ms,
# > 0: a measured kernel takes time) and a part of a time that may be 0 (a reshape, a CPU stage).
COUNT: dict[str, Any] = {"minimum": 1, "whole": True}
SIZE: dict[str, Any] = {"minimum": 0, "whole": True}
TIME: dict[str, Any] = {"above": 0}
PART: dict[str, Any] = {"minimum": 0}
MIN_CURVE_POINTS = 4
"""Fewest distinct points of a fitted curve: its held-out error fits on half of them (a curve
needs two knots) and scores on the other half."""
ATTENTION_FILE = "a100/attention_llama-2-70b_tp2.csv"
ALL_REDUCE_FILE = "a100/all_reduce_dgx.csv"
CPU_FILE = "a100/cpu_overheads.csv"


def mlp_file(model: str, gpu: str = "a100-80gb") -> str:
    """Path of ``model``'s MLP profile on ``gpu`` relative to the profiles folder."""
    stems = {**MLP_PROFILES, **EXTRA_MLP_PROFILES}
    if model not in stems:
        raise UserError(
            f"no A100 profile for model '{model}'; profiled: {', '.join(stems)}",
            field="model",
        )
    return f"{GPU_DIRS[gpu]}/mlp/{stems[model]}.csv"


def all_reduce_file(gpu: str = "a100-80gb") -> str | None:
    """NCCL all-reduce profile of ``gpu`` (DGX NVSwitch node), or None (A40: none)."""
    return {"a100-80gb": ALL_REDUCE_FILE, "h100-sxm": "h100/all_reduce_dgx.csv"}.get(gpu)


def licence(gpu: str = "a100-80gb") -> str:
    """Provenance line of calibrations fitted on ``gpu``'s profiles."""
    if gpu == "a100-80gb":
        return LICENCE
    return f"derived from Microsoft Vidur {GPU_TITLES[gpu]} and A100 profiles (MIT)"


def _read(profiles_dir: Path, rel: str, needed: list[str]) -> tuple[pd.DataFrame, Path]:
    path = Path(profiles_dir) / rel
    if not path.is_file():
        raise UserError(
            f"profile file not found: {path} (--profiles should be the folder holding a100/)",
            field="profiles",
        )
    frame = _as_profile_error(read_csv, path)
    _as_profile_error(require_columns, frame, needed, path)
    return frame, path


def _as_profile_error(check: Callable[..., Any], *args: Any) -> Any:
    """``check(*args)``, its UserError reported under the ``profiles`` option."""
    try:
        return check(*args)
    except UserError as exc:
        raise UserError(str(exc), field="profiles") from None


def _checked(
    frame: pd.DataFrame, path: Path, rules: dict[str, dict[str, Any]], rows: np.ndarray | None = None
) -> pd.DataFrame:
    """``frame`` with each column of ``rules`` replaced by its checked float values.

    A rule is :func:`~sim.io.csv_reader.number_column`'s keywords (see :data:`COUNT`, :data:`TIME`...);
    only ``rows`` (a mask) are checked when given, the others keep whatever they hold (NaN).
    """
    return frame.assign(
        **{column: _as_profile_error(_number, frame, column, path, rows, rule) for column, rule in rules.items()}
    )


def _number(frame: pd.DataFrame, column: str, path: Path, rows: np.ndarray | None, rule: dict) -> np.ndarray:
    values = number_column(frame, column, path, rows=rows, **rule)
    # Counts stay integers (TP 2, not 2.0) wherever every row was checked.
    return values.astype(np.int64) if rule.get("whole") and rows is None else values


def _require_points(count: int, needed: int, what: str, path: Path) -> None:
    """Refuse a fit with fewer than ``needed`` distinct points: the fit and its held-out score need them."""
    if count < needed:
        raise UserError(
            f"{path}: {count} usable row{'' if count == 1 else 's'} for {what}; a fit needs at least {needed} "
            "(half to fit, half to score the fit on)",
            field="profiles",
        )


def load_mlp(profiles_dir: Path, model: str, gpu: str = "a100-80gb") -> pd.DataFrame:
    """Per-layer op medians of ``model`` on ``gpu``: columns ``tp``, ``tokens``, ``emb`` and
    each op present in the file (phi-2 has no post-attention norm), sorted by (tp, tokens)."""
    base = ["num_tokens", "num_tensor_parallel_workers", "time_stats.emb.median"]
    frame, path = _read(profiles_dir, mlp_file(model, gpu), base + ["time_stats.mlp_up_proj.median"])
    ops = ["emb"] + [op for op in LAYER_OPS if f"time_stats.{op}.median" in frame.columns]
    rules = {"num_tokens": COUNT, "num_tensor_parallel_workers": COUNT}
    frame = _checked(frame, path, rules | {f"time_stats.{op}.median": TIME for op in ops})
    tidy = frame.rename(columns={f"time_stats.{op}.median": op for op in ops})
    tidy = tidy.rename(columns={"num_tokens": "tokens", "num_tensor_parallel_workers": "tp"})
    tidy = tidy.groupby(["tp", "tokens"], as_index=False)[ops].mean()
    for tp, rows in tidy.groupby("tp"):
        _require_points(len(rows), MIN_CURVE_POINTS, f"the linear ops at TP{tp:g}", path)
    return tidy


def load_attention(profiles_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The FlashAttention profile as (decode, prefill) tables of per-layer ms.

    decode: ``batch_size``, ``kv_cache_size``, ``ms``; prefill: ``chunk``,
    ``kv_cache_size``, ``ms``. ``ms`` includes the small KV-cache reshape ops around the
    kernel, which run whenever attention does.
    """
    reshapes = ["time_stats.attn_input_reshape.median", "time_stats.attn_output_reshape.median"]
    decode_ms, prefill_ms = "time_stats.attn_decode.median", "time_stats.attn_prefill.median"
    cols = ["is_prefill", "batch_size", "prefill_chunk_size", "kv_cache_size", decode_ms, prefill_ms, *reshapes]
    frame, path = _read(profiles_dir, ATTENTION_FILE, cols)
    prefill_mask = _flag_column(frame, "is_prefill", path)
    rules = {"batch_size": COUNT, "kv_cache_size": SIZE, "prefill_chunk_size": SIZE} | dict.fromkeys(reshapes, PART)
    frame = _checked(frame, path, rules)
    # Each kernel's median is only measured on its own rows (NaN on the others).
    frame = _checked(frame, path, {decode_ms: TIME}, rows=~prefill_mask)
    frame = _checked(frame, path, {prefill_ms: TIME, "prefill_chunk_size": COUNT}, rows=prefill_mask)
    reshape = frame[reshapes[0]] + frame[reshapes[1]]
    dec = frame[~prefill_mask].assign(ms=frame[decode_ms] + reshape)
    pre = frame[prefill_mask].assign(ms=frame[prefill_ms] + reshape)
    dec = dec.groupby(["batch_size", "kv_cache_size"], as_index=False)["ms"].mean()
    pre = pre.rename(columns={"prefill_chunk_size": "chunk"})
    pre = pre.groupby(["chunk", "kv_cache_size"], as_index=False)["ms"].mean()
    for name, table, terms in (("decode", dec, DECODE_TERMS), ("prefill", pre, PREFILL_TERMS)):
        fitted = int((table["ms"] > FIT_MIN_MS).sum())
        _require_points(fitted, 2 * len(terms), f"the {name} attention fit (rows above {FIT_MIN_MS} ms)", path)
    return dec, pre


def _flag_column(frame: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    """A true/false column as a boolean mask; UserError naming the first other cell."""
    text = frame[column].astype(str).str.strip().str.lower()
    bad = ~text.isin(["true", "false"]).to_numpy()
    if bad.any():
        row = int(np.argmax(bad))
        cell = cell_text(frame, row, column, path)
        raise UserError(f"{where(path, row, column)}: {cell} is not true or false", field="profiles")
    return (text == "true").to_numpy()


def load_all_reduce(profiles_dir: Path, num_gpus: int, gpu: str = "a100-80gb") -> pd.DataFrame:
    """All-reduce medians for ``num_gpus`` GPUs: columns ``size``, ``ms``, sorted by size.

    Uses the rows with all GPUs in one node (NVLink) up to 8; 16 GPUs span two nodes.
    """
    rel = all_reduce_file(gpu)
    if rel is None:
        raise UserError(f"no all-reduce profile for {gpu}", field="gpu")
    median = "time_stats.all_reduce.median"
    rules = {"size": COUNT, "num_workers": COUNT, "devices_per_node": COUNT, median: TIME}
    frame, path = _read(profiles_dir, rel, list(rules))
    frame = _checked(frame, path, rules)
    per_node = min(num_gpus, 8)
    rows = frame[(frame["num_workers"] == num_gpus) & (frame["devices_per_node"] == per_node)]
    if rows.empty:
        raise UserError(
            f"{rel}: no all-reduce rows for {num_gpus} GPUs; profiled: {sorted(set(frame['num_workers']))}",
            field="tensor_parallel",
        )
    rows = rows.rename(columns={median: "ms"})
    table = rows.groupby("size", as_index=False)["ms"].median()
    _require_points(len(table), MIN_CURVE_POINTS, f"the all-reduce curve on {num_gpus} GPUs", path)
    return table


def load_cpu_overheads(profiles_dir: Path) -> pd.DataFrame:
    """Engine CPU ms per iteration: columns ``model`` (batchsim name), ``tp``,
    ``batch_size``, ``ms`` (schedule + prepare inputs + sampler + process outputs, medians).
    Rows of models outside the catalog (Qwen-72B, InternLM-20B) are dropped."""
    rules = {"tensor_parallel_degree": COUNT, "batch_size": COUNT} | dict.fromkeys(CPU_PARTS, PART)
    frame, path = _read(profiles_dir, CPU_FILE, ["model_name", *rules])
    names = {v: k for k, v in CPU_PROFILES.items()}
    kept = frame["model_name"].isin(names).to_numpy()
    if not kept.any():
        raise UserError(
            f"{path}: no rows of a catalog model; model_name must be one of {', '.join(names)}", field="profiles"
        )
    frame = _checked(frame, path, rules, rows=kept)[kept]  # checked in place: the message keeps the file's lines
    tidy = pd.DataFrame(
        {
            "model": frame["model_name"].map(names),
            "tp": frame["tensor_parallel_degree"].astype(np.int64),
            "batch_size": frame["batch_size"].astype(np.int64),  # checked whole on the kept rows
            "ms": frame[list(CPU_PARTS)].sum(axis=1),
        }
    )
    tidy = tidy.groupby(["model", "tp", "batch_size"], as_index=False)["ms"].mean()
    for (model, tp), rows in tidy.groupby(["model", "tp"]):
        _require_points(len(rows), MIN_CURVE_POINTS, f"the CPU overhead of {model} TP{tp}", path)
    return tidy


class ProfileSet:
    """The profiles folder, each table read once on first use (per instance, not global).

    Args:
        root: the folder holding ``a100/`` (``../shared/profiles`` next to the repo).
        gpu: whose linear-op and all-reduce profiles to read; attention and CPU overhead
            are always the A100's (the only ones profiled).
    """

    def __init__(self, root: str | Path, gpu: str = "a100-80gb") -> None:
        self.root = Path(root)
        self.gpu = gpu
        self._tables: dict[tuple, object] = {}

    def _cached(self, key: tuple, load: Callable[[], Any]) -> Any:
        if key not in self._tables:
            self._tables[key] = load()
        return self._tables[key]

    def mlp(self, model: str) -> pd.DataFrame:
        """See :func:`load_mlp`."""
        return self._cached(("mlp", model), lambda: load_mlp(self.root, model, self.gpu))

    def all_mlp(self, extra: bool = False) -> dict[str, pd.DataFrame]:
        """MLP tables of every profiled model on this GPU (the six of the A100 roofline
        fit; with ``extra`` also InternLM-20B and Qwen-72B)."""
        names = [*MLP_PROFILES, *(EXTRA_MLP_PROFILES if extra else ())]
        present = [m for m in names if self.gpu == "a100-80gb" or (self.root / mlp_file(m, self.gpu)).is_file()]
        return {model: self.mlp(model) for model in present}

    def profiled_models(self) -> list[str]:
        """Models with a linear-op profile on this GPU."""
        return list(self.all_mlp(extra=True))

    def attention(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """See :func:`load_attention`."""
        return self._cached(("attention",), lambda: load_attention(self.root))

    def all_reduce(self, num_gpus: int) -> pd.DataFrame:
        """See :func:`load_all_reduce`."""
        return self._cached(("all_reduce", num_gpus), lambda: load_all_reduce(self.root, num_gpus, self.gpu))

    def cpu(self) -> pd.DataFrame:
        """See :func:`load_cpu_overheads`."""
        return self._cached(("cpu",), lambda: load_cpu_overheads(self.root))
