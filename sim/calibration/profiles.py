"""Reading Vidur's A100 (and H100, A40 linear-op) profile CSVs into tidy tables (milliseconds throughout).

Only the fitting code reads these; the simulator itself loads the committed calibration
files. Every loader checks that its file exists and has the columns it needs, and raises
:class:`UserError` naming the file otherwise. Rows measured twice at the same point
(the MLP profiles repeat 2048 and 4096 tokens) are merged by averaging their medians.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import UserError
from sim.hardware.calibration_files import GPU_DIRS, LICENCE
from sim.hardware.roofline import LAYER_OPS

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


def _read(profiles_dir: Path, rel: str, needed: list[str]) -> pd.DataFrame:
    path = Path(profiles_dir) / rel
    if not path.is_file():
        raise UserError(
            f"profile file not found: {path} (--profiles should be the folder holding a100/)",
            field="profiles",
        )
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise UserError(f"{path}: not a readable CSV: {exc}", field="profiles") from None
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise UserError(f"{path}: missing columns {', '.join(missing)}", field="profiles")
    return frame


def load_mlp(profiles_dir: Path, model: str, gpu: str = "a100-80gb") -> pd.DataFrame:
    """Per-layer op medians of ``model`` on ``gpu``: columns ``tp``, ``tokens``, ``emb`` and
    each op present in the file (phi-2 has no post-attention norm), sorted by (tp, tokens)."""
    base = ["num_tokens", "num_tensor_parallel_workers", "time_stats.emb.median"]
    frame = _read(profiles_dir, mlp_file(model, gpu), base + ["time_stats.mlp_up_proj.median"])
    ops = ["emb"] + [op for op in LAYER_OPS if f"time_stats.{op}.median" in frame.columns]
    tidy = frame.rename(columns={f"time_stats.{op}.median": op for op in ops})
    tidy = tidy.rename(columns={"num_tokens": "tokens", "num_tensor_parallel_workers": "tp"})
    return tidy.groupby(["tp", "tokens"], as_index=False)[ops].mean()


def load_attention(profiles_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The FlashAttention profile as (decode, prefill) tables of per-layer ms.

    decode: ``batch_size``, ``kv_cache_size``, ``ms``; prefill: ``chunk``,
    ``kv_cache_size``, ``ms``. ``ms`` includes the small KV-cache reshape ops around the
    kernel, which run whenever attention does.
    """
    cols = [
        "is_prefill",
        "batch_size",
        "prefill_chunk_size",
        "kv_cache_size",
        "time_stats.attn_decode.median",
        "time_stats.attn_prefill.median",
        "time_stats.attn_input_reshape.median",
        "time_stats.attn_output_reshape.median",
    ]
    frame = _read(profiles_dir, ATTENTION_FILE, cols)
    reshape = (
        frame["time_stats.attn_input_reshape.median"]
        + frame["time_stats.attn_output_reshape.median"]
    )
    prefill_mask = frame["is_prefill"].astype(str).str.lower() == "true"
    dec = frame[~prefill_mask].assign(ms=frame["time_stats.attn_decode.median"] + reshape)
    pre = frame[prefill_mask].assign(ms=frame["time_stats.attn_prefill.median"] + reshape)
    dec = dec.groupby(["batch_size", "kv_cache_size"], as_index=False)["ms"].mean()
    pre = pre.rename(columns={"prefill_chunk_size": "chunk"})
    pre = pre.groupby(["chunk", "kv_cache_size"], as_index=False)["ms"].mean()
    return dec.dropna(), pre.dropna()


def load_all_reduce(profiles_dir: Path, num_gpus: int, gpu: str = "a100-80gb") -> pd.DataFrame:
    """All-reduce medians for ``num_gpus`` GPUs: columns ``size``, ``ms``, sorted by size.

    Uses the rows with all GPUs in one node (NVLink) up to 8; 16 GPUs span two nodes.
    """
    rel = all_reduce_file(gpu)
    if rel is None:
        raise UserError(f"no all-reduce profile for {gpu}", field="gpu")
    frame = _read(
        profiles_dir,
        rel,
        ["size", "num_workers", "devices_per_node", "time_stats.all_reduce.median"],
    )
    per_node = min(num_gpus, 8)
    rows = frame[(frame["num_workers"] == num_gpus) & (frame["devices_per_node"] == per_node)]
    if rows.empty:
        raise UserError(
            f"{rel}: no all-reduce rows for {num_gpus} GPUs; profiled: "
            f"{sorted(set(frame['num_workers']))}",
            field="tensor_parallel",
        )
    rows = rows.rename(columns={"time_stats.all_reduce.median": "ms"})
    return rows.groupby("size", as_index=False)["ms"].median()


def load_cpu_overheads(profiles_dir: Path) -> pd.DataFrame:
    """Engine CPU ms per iteration: columns ``model`` (batchsim name), ``tp``,
    ``batch_size``, ``ms`` (schedule + prepare inputs + sampler + process outputs, medians).
    Rows of models outside the catalog (Qwen-72B, InternLM-20B) are dropped."""
    frame = _read(
        profiles_dir, CPU_FILE, ["model_name", "tensor_parallel_degree", "batch_size", *CPU_PARTS]
    )
    names = {v: k for k, v in CPU_PROFILES.items()}
    frame = frame[frame["model_name"].isin(names)]
    tidy = pd.DataFrame(
        {
            "model": frame["model_name"].map(names),
            "tp": frame["tensor_parallel_degree"],
            "batch_size": frame["batch_size"],
            "ms": frame[list(CPU_PARTS)].sum(axis=1),
        }
    )
    return tidy.groupby(["model", "tp", "batch_size"], as_index=False)["ms"].mean()


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
        present = [
            m
            for m in names
            if self.gpu == "a100-80gb" or (self.root / mlp_file(m, self.gpu)).is_file()
        ]
        return {model: self.mlp(model) for model in present}

    def profiled_models(self) -> list[str]:
        """Models with a linear-op profile on this GPU."""
        return list(self.all_mlp(extra=True))

    def attention(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """See :func:`load_attention`."""
        return self._cached(("attention",), lambda: load_attention(self.root))

    def all_reduce(self, num_gpus: int) -> pd.DataFrame:
        """See :func:`load_all_reduce`."""
        return self._cached(
            ("all_reduce", num_gpus), lambda: load_all_reduce(self.root, num_gpus, self.gpu)
        )

    def cpu(self) -> pd.DataFrame:
        """See :func:`load_cpu_overheads`."""
        return self._cached(("cpu",), lambda: load_cpu_overheads(self.root))
