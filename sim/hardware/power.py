"""GPU power of a forward pass, from the pass's MFU and MBU, and where every figure comes from.

One GPU of a replica running pass i draws

    P_i = P_idle + (P_tdp - P_idle) x min(1, K_MEMORY x MBU_i + K_COMPUTE x MFU_i)

and P_idle while it runs no pass. P_tdp is the datasheet board power (the power limit the GPU
throttles at), P_idle the power with the model loaded and nothing running; the share of the
dynamic range a pass uses grows with the HBM traffic it moves (MBU) and the arithmetic it does
(MFU), both from :class:`sim.hardware.utilization.PassWork`. The cap is the power limit: a GPU
asked for more slows its clocks rather than draw more (which is why a saturated decode step sits
at TDP, not above it).

K_MEMORY and K_COMPUTE are shared by every GPU (the shape of power vs utilization is assumed
the same across NVIDIA data-centre parts; only TDP and idle differ). They were fitted on two
points of one public measurement and checked on the five others (docs/cost.md,
``python benchmarks/bench_energy.py --fit``): the ML.ENERGY Leaderboard v3.0 runs of
Llama-3.1-8B on one H100 SXM with vLLM 0.11.1 (ml-energy/leaderboard, public/data/models/
meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json). At max_num_seqs 8 the simulated passes
are memory-bound (MBU 0.61, MFU 0.04) and the GPU was measured at 486 W; at 512 they are
compute-heavy (MFU 0.34, MBU 0.38) and it drew 688 W, 98% of its 700 W TDP. The shares that
reproduce both (per pass, with the cap) are below; the held-out points' power then matches
within 0.6%.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.hardware.catalog import GPUSpec

K_MEMORY = 0.95
"""Share of (TDP - idle) a pass streaming HBM at full bandwidth (MBU = 1, no arithmetic) draws."""

K_COMPUTE = 2.22
"""Share of (TDP - idle) per unit of MFU: a pass at MFU 1/2.22 = 0.45 alone reaches the power limit."""

SOURCES: dict[str, dict[str, str]] = {
    "a100-80gb": {
        "tdp_w": "NVIDIA A100 Tensor Core GPU datasheet: 400 W max TDP (SXM4 80GB)",
        "idle_w": "assumed: the H200's measured idle share of TDP (80.3 W / 700 W = 11.5%) x 400 W",
        "usd_per_hour": "RunPod Serverless active worker, A100 80 GB: $0.00060/s (docs.runpod.io/serverless/pricing, "
        "as listed 2025-2026)",
    },
    "a100-40gb": {
        "tdp_w": "NVIDIA A100 Tensor Core GPU datasheet: 400 W max TDP (SXM4 40GB)",
        "idle_w": "assumed: as a100-80gb (same board and clocks)",
        "usd_per_hour": "no listed price in the source used for the others: set gpu_hour_usd",
    },
    "h100-sxm": {
        "tdp_w": "NVIDIA H100 Tensor Core GPU datasheet: up to 700 W (SXM5)",
        "idle_w": "H200 SXM (the same 700 W SXM5 board) measured at 80.3 W idle (api.serialalice.pt GPU energy "
        "benchmark, 2026)",
        "usd_per_hour": "RunPod Serverless active worker, H100 PRO 80 GB: $0.00093/s (docs.runpod.io/serverless/"
        "pricing, as listed 2025-2026)",
    },
    "h200": {
        "tdp_w": "NVIDIA H200 Tensor Core GPU datasheet: up to 700 W (SXM)",
        "idle_w": "measured 80.3 W idle on an H200 SXM (api.serialalice.pt GPU energy benchmark, 2026)",
        "usd_per_hour": "RunPod Serverless active worker, H200 PRO 141 GB: $0.00124/s (docs.runpod.io/serverless/"
        "pricing, as listed 2025-2026)",
    },
    "a40": {
        "tdp_w": "NVIDIA A40 datasheet: 300 W max power consumption",
        "idle_w": "30 W bare idle (NVIDIA/open-gpu-kernel-modules#874: 'around 30W which is normal for a A40') + "
        "66 W for a CUDA context on a GDDR6 card (Vadari 2026, 'The Model Parking Tax', arXiv:2605.23918, L40S)",
        "usd_per_hour": "RunPod Serverless active worker, A6000/A40 48 GB: $0.00024/s (docs.runpod.io/serverless/"
        "pricing, as listed 2025-2026)",
    },
    "l40s": {
        "tdp_w": "NVIDIA L40S datasheet: 350 W max power consumption",
        "idle_w": "assumed: A40's 30 W bare idle + the 66 W CUDA-context step measured on an L40S (Vadari 2026, "
        "arXiv:2605.23918)",
        "usd_per_hour": "RunPod Serverless active worker, L40/L40S 48 GB: $0.00037/s (docs.runpod.io/serverless/"
        "pricing, as listed 2025-2026)",
    },
}
"""Per catalog GPU, where its ``tdp_w``, ``idle_w`` and ``usd_per_hour`` come from."""


@dataclass(frozen=True)
class PowerModel:
    """Power of one GPU as a function of what its passes do.

    Attributes:
        tdp_w: board power limit, W.
        idle_w: power with nothing running, W.
        memory_share: share of (tdp - idle) at MBU = 1 (:data:`K_MEMORY`).
        compute_share: share of (tdp - idle) per unit of MFU (:data:`K_COMPUTE`).
    """

    tdp_w: float
    idle_w: float
    memory_share: float = K_MEMORY
    compute_share: float = K_COMPUTE

    @classmethod
    def of(cls, gpu: GPUSpec) -> PowerModel | None:
        """The catalog GPU's model; None when its TDP is unknown."""
        if gpu.tdp_w <= 0:
            return None
        return cls(tdp_w=gpu.tdp_w, idle_w=gpu.idle_w)

    def pass_watts(self, mfu: np.ndarray, mbu: np.ndarray) -> np.ndarray:
        """Watts of one GPU during passes with these MFU and MBU (a new array).

        A NaN utilization (a pass of zero duration, which holds no energy) counts as none.
        """
        load = self.memory_share * np.nan_to_num(np.asarray(mbu, float)) + self.compute_share * np.nan_to_num(
            np.asarray(mfu, float)
        )
        return self.idle_w + (self.tdp_w - self.idle_w) * np.minimum(load, 1.0)
