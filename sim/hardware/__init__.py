"""Hardware layer: model/GPU catalog, KV-cache memory budget and the iteration cost model.

``load_cost_model(model, gpu, tp)`` returns a :class:`CostModel` whose
``iteration_time_s`` / ``time_from_totals_s`` give the GPU time of one forward pass;
``kv_budget`` sizes the KV cache. Calibrations are data files under ``calibrations/``,
fitted from Vidur's A100 profiles by ``python -m sim calibrate``.
"""

from sim.hardware.catalog import (
    GPUS,
    MODELS,
    GPUSpec,
    ModelSpec,
    check_tensor_parallel,
    get_gpu,
    get_model,
)
from sim.hardware.cost_model import COMPONENTS, CostModel, load_cost_model
from sim.hardware.memory import KVBudget, kv_budget, kv_bytes_per_token

__all__ = [
    "COMPONENTS",
    "GPUS",
    "MODELS",
    "CostModel",
    "GPUSpec",
    "KVBudget",
    "ModelSpec",
    "check_tensor_parallel",
    "get_gpu",
    "get_model",
    "kv_budget",
    "kv_bytes_per_token",
    "load_cost_model",
]
