"""Hardware layer: what a run loads: the model/GPU catalog, the KV-cache memory budget and the iteration cost model.

``load_cost_model(model, gpu, tp)`` returns a :class:`CostModel` whose
``iteration_time_s`` / ``time_from_totals_s`` give the GPU time of one forward pass;
``kv_budget`` sizes the KV cache. Calibrations are data files under ``calibrations/``
(read by :mod:`sim.hardware.calibration_files`), fitted from Vidur's profiles by the
offline pipeline :mod:`sim.calibration` (``python -m sim calibrate``).

The names below load on first use, so importing one light submodule (the catalog, the
calibration file locations) does not pull in numpy and the cost model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.lazy import lazy_attributes

_CATALOG = ("GPUS", "MODELS", "GPUSpec", "ModelSpec", "check_tensor_parallel", "get_gpu", "get_model")
_COST_MODEL = ("COMPONENTS", "CostModel", "load_cost_model")
_MEMORY = ("KVBudget", "kv_budget", "kv_bytes_per_token")
__all__ = [  # noqa: RUF022 - grouped by home module
    "GPUS", "MODELS", "GPUSpec", "ModelSpec", "check_tensor_parallel", "get_gpu", "get_model",
    "COMPONENTS", "CostModel", "load_cost_model",
    "KVBudget", "kv_budget", "kv_bytes_per_token",
]
__getattr__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(_CATALOG, "sim.hardware.catalog"),
        **dict.fromkeys(_COST_MODEL, "sim.hardware.cost_model"),
        **dict.fromkeys(_MEMORY, "sim.hardware.memory"),
    },
)

if TYPE_CHECKING:
    from sim.hardware.catalog import GPUS, MODELS, GPUSpec, ModelSpec, check_tensor_parallel, get_gpu, get_model
    from sim.hardware.cost_model import COMPONENTS, CostModel, load_cost_model
    from sim.hardware.memory import KVBudget, kv_budget, kv_bytes_per_token
