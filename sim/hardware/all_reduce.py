"""Tensor-parallel all-reduce as serving engines run it: the algorithm by message size and
interconnect, inside a CUDA graph or eager.

Every transformer layer ends its attention and its MLP with an all-reduce of the layer's
output, tokens x hidden x dtype bytes (two per layer). What one costs depends on what the
engine runs (vLLM, ``vllm/distributed/device_communicators/custom_all_reduce.py`` and
``csrc/custom_all_reduce.cuh``):

* **custom all-reduce** on GPUs that NVLink/NVSwitch connects all-to-all, for 2, 4, 6 or 8
  GPUs and messages below its size limit (``CustomAllreduce(max_size=8192 * 1024)``):
  *one-shot* (every GPU reads each peer's whole buffer and reduces: (n - 1) x S bytes in) for
  2 GPUs always, for up to 4 GPUs below 512 KiB and up to 8 below 256 KiB; *two-shot*
  (reduce-scatter, then all-gather: 2 (n - 1)/n x S bytes) above;
* **NCCL** for larger messages, other GPU counts, and always on PCIe GPUs (vLLM disables its
  kernel on more than two PCIe-only GPUs; batchsim's PCIe cards never use it).

Device time of one call: custom, ``latency + S / bandwidth`` per (GPU family, GPU count,
algorithm) from public benchmarks (:data:`CUSTOM_AR`, each entry names its source); NCCL, the
calibration's curve (Vidur's NCCL profile: the kernel's own time in an eager loop, measured
with the PyTorch profiler). A CUDA graph replays the kernels with no host work; eager
execution adds each launch's host overhead (:data:`LAUNCH_US`): one launch for NCCL, two
for the custom kernel, which first copies its input into its registered buffer.

Per pass: ``2 x layers x`` the per-call time at message tokens x hidden x dtype bytes, made
non-decreasing in the token count (the upper envelope: just past the custom kernel's size
limit NCCL can be faster than the custom kernel just below it; the cost model keeps every
term monotone in tokens). See docs/cost_model.md for the tables and their sources.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.hardware.catalog import GPUSpec

KIB = 1024
MIB = 1024 * KIB

VLLM_CUSTOM_AR_MAX_BYTES = 8 * MIB
"""vLLM ``CustomAllreduce.__init__(max_size=8192 * 1024)`` (custom_all_reduce.py, v0.4 to v0.15); the kernel runs
on messages strictly below it (``should_custom_ar``: ``inp_size < self.max_size``)."""
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
"""``CustomAllreduce._SUPPORTED_WORLD_SIZES``: other GPU counts use NCCL."""
ONE_SHOT_BELOW = {4: 512 * KIB, 8: 256 * KIB}
"""csrc/custom_all_reduce.cuh ``allreduce``: with full NVLink, one-shot when ``world_size <= 4 && bytes < 512 KiB``
or ``world_size <= 8 && bytes < 256 KiB``, two-shot otherwise; 2 GPUs are always one-shot."""
LAUNCH_US = 4.3
"""Host overhead of one kernel launch in eager mode (µs): median over 9 (GPU count, size) cells of vLLM's eager custom
all-reduce (copy + kernel, two launches) minus SGLang's copy-in kernel (one launch), H100, TP 2/4/8, messages
<= 128 KiB where the host loop is the bottleneck (sgl-project/sglang PR #2904, test_trt_reduce.py)."""
EAGER_LAUNCHES = {"one_shot": 2, "two_shot": 2, "nccl": 1}
"""Launches per eager call: the custom kernel first copies its input into its IPC-registered buffer
(custom_all_reduce.py: "outside of cuda graph context, custom allreduce incurs a cost of cudaMemcpy"); inside a
graph the captured input address is registered instead, and nothing is launched from the host."""


@dataclass(frozen=True)
class KernelFit:
    """Device time of one custom all-reduce call: ``latency_us + message bytes / bandwidth``.

    Attributes:
        latency_us: time at zero bytes (barriers, first-wave fill), µs.
        gb_per_s: message bytes per second (algorithm bandwidth, GB/s): NVLink traffic per GPU is
            (n - 1) x S one-shot and 2 (n - 1)/n x S two-shot, so this is below the link's rate.
        source: where the two numbers come from.
    """

    latency_us: float
    gb_per_s: float
    source: str

    def ms(self, message_bytes: np.ndarray, link_scale: float = 1.0) -> np.ndarray:
        """Milliseconds at ``message_bytes``, bandwidth times ``link_scale`` (another GPU's link over this fit's)."""
        return (self.latency_us + message_bytes / (self.gb_per_s * link_scale * 1e3)) * 1e-3


_PR24111 = "vLLM PR #24111 (benchmark_device_communicators.py, H100, bf16, in a CUDA graph)"
_PR24532 = "vLLM PR #24532 (same benchmark, H100 TP4)"
_SGL2904 = "sgl-project/sglang PR #2904 (vLLM's kernel, H100, eager, >= 1 MiB where the loop is GPU-bound)"
_SGL2688 = "sgl-project/sglang PR #2688 (vLLM's kernel, A100, eager, >= 1 MiB where the loop is GPU-bound)"

CUSTOM_AR: dict[tuple[str, int, str], KernelFit] = {
    # H100 SXM (NVLink 4, 450 GB/s per direction); least squares over the rows named.
    ("hopper", 2, "one_shot"): KernelFit(
        4.7, 230.0, f"{_PR24111}: 7 µs at 0.5 MiB; slope of {_SGL2904}, 1-4 MiB"),
    ("hopper", 4, "one_shot"): KernelFit(6.6, 133.0, f"{_PR24111} and {_PR24532}: ca_1stage, 0.5-4 MiB"),
    ("hopper", 4, "two_shot"): KernelFit(12.6, 140.0, f"{_PR24111} and {_PR24532}: ca_2stage, 0.5-4 MiB"),
    ("hopper", 6, "one_shot"): KernelFit(5.2, 65.0, f"{_PR24111}: TP6 ca_1stage, 0.5-4 MiB"),
    ("hopper", 6, "two_shot"): KernelFit(11.4, 167.0, f"{_PR24111}: TP6 ca_2stage, 0.5-4 MiB"),
    ("hopper", 8, "one_shot"): KernelFit(
        5.2, 46.0, "not measured: TP6's latency; TP6's per-GPU NVLink intake (5 x 65 GB/s) over 7 peers"),
    ("hopper", 8, "two_shot"): KernelFit(16.8, 150.0, f"{_SGL2904}: TP8, 1-4 MiB"),
    # A100 SXM (NVLink 3, 300 GB/s): bandwidth from the eager rows (GPU-bound); latency = the eager intercept less
    # H100's eager-minus-graph intercept at the same GPU count (TP2 3.7 µs, TP4 two-shot 1.4 µs).
    ("ampere", 2, "one_shot"): KernelFit(7.9, 194.0, f"{_SGL2688}: TP2, 1-8 MiB (intercept 11.6 µs eager)"),
    ("ampere", 4, "two_shot"): KernelFit(14.6, 135.0, f"{_SGL2688}: TP4, 1-4 MiB (intercept 16.0 µs eager)"),
}  # fmt: skip
"""Custom all-reduce device time per (GPU family, GPUs, algorithm). Cells not listed use the Hopper cell with its
bandwidth scaled by the GPU's NVLink rate over the H100's (:func:`custom_fit`)."""

GPU_FAMILY = {"h100-sxm": "hopper", "h200": "hopper", "a100-80gb": "ampere", "a100-40gb": "ampere"}
"""Catalog GPU -> the family whose custom all-reduce measurements apply; other NVLink GPUs scale the Hopper cells."""
_HOPPER_LINK_GB_PER_S = 450.0


@dataclass(frozen=True)
class AllReduceSpec:
    """How an engine runs its all-reduces: a policy's ``all_reduce`` block (the algorithm) and its CUDA graphs.

    Attributes:
        algorithm: "custom" (vLLM's custom kernel below ``custom_max_bytes`` on NVLink GPUs, NCCL otherwise) or
            "nccl" (NCCL always, e.g. ``--disable-custom-all-reduce``).
        custom_max_bytes: the custom kernel runs on messages strictly smaller than this.
        graph_max_tokens: passes of at most this many tokens replay a CUDA graph (0: always eager): the largest
            of the policy's ``cuda_graphs.capture_sizes``.
        graph_mixed_batches: passes with prefill tokens are graphed too (``cuda_graphs.batches: all``, vLLM V1
            piecewise graphs); otherwise only decode-only passes (vLLM V0 captures decode batches).
    """

    algorithm: str = "custom"
    custom_max_bytes: int = VLLM_CUSTOM_AR_MAX_BYTES
    graph_max_tokens: int = 0
    graph_mixed_batches: bool = False

    @classmethod
    def of(cls, policy: Any) -> AllReduceSpec:
        """The settings of a policy config: its ``all_reduce`` block and its ``cuda_graphs`` block, if it has them
        (without ``cuda_graphs`` every pass runs eagerly, as the profiles were measured)."""
        block, graphs = getattr(policy, "all_reduce", None), getattr(policy, "cuda_graphs", None)
        algorithm = cls.algorithm if block is None else block.algorithm
        limit = cls.custom_max_bytes if block is None else block.custom_max_bytes
        if graphs is None:
            return cls(algorithm, limit)
        return cls(algorithm, limit, max(graphs.capture_sizes), graphs.batches == "all")

    def graphed(self, tokens: int, prefill_seqs: int) -> bool:
        """Whether a pass of ``tokens`` tokens with ``prefill_seqs`` prefill pieces replays a CUDA graph."""
        return tokens <= self.graph_max_tokens and (prefill_seqs == 0 or self.graph_mixed_batches)


NCCL_EAGER = AllReduceSpec(algorithm="nccl")
"""The calibration's NCCL curve alone, every pass eager (plus its launch): how the profiles were measured."""
VLLM_V0_GRAPHS = AllReduceSpec(graph_max_tokens=256)
"""vLLM V0 (0.4 to 0.9): the custom kernel; decode passes of up to 256 sequences replay a graph."""
VLLM_V1_GRAPHS = AllReduceSpec(graph_max_tokens=512, graph_mixed_batches=True)
"""vLLM V1 (0.11, 0.15): the custom kernel; every pass of up to 512 tokens replays a (piecewise) graph."""


def custom_available(gpu: GPUSpec, gpus: int) -> bool:
    """Whether vLLM's custom kernel can run on ``gpus`` x ``gpu``: NVLink and a supported GPU count."""
    return gpu.interconnect == "NVLink" and gpus in CUSTOM_AR_WORLD_SIZES


def algorithms(spec: AllReduceSpec, gpu: GPUSpec, gpus: int, message_bytes: np.ndarray) -> np.ndarray:
    """The algorithm each message runs: "one_shot", "two_shot" or "nccl" (an array of str)."""
    size = np.asarray(message_bytes, float)
    if spec.algorithm != "custom" or not custom_available(gpu, gpus):
        return np.full(size.shape, "nccl", dtype=object)
    one_shot_below = np.inf if gpus == 2 else ONE_SHOT_BELOW[4 if gpus <= 4 else 8]
    custom = np.where(size < one_shot_below, "one_shot", "two_shot").astype(object)
    return np.where(size < spec.custom_max_bytes, custom, "nccl").astype(object)


def custom_fit(gpu: GPUSpec, gpus: int, algorithm: str) -> tuple[KernelFit, float]:
    """The fit of ``algorithm`` on ``gpus`` x ``gpu`` and the bandwidth factor to apply to it."""
    family = GPU_FAMILY.get(gpu.name, "")
    if (family, gpus, algorithm) in CUSTOM_AR:
        return CUSTOM_AR[(family, gpus, algorithm)], 1.0
    return CUSTOM_AR[("hopper", gpus, algorithm)], gpu.nvlink_gb_per_s / _HOPPER_LINK_GB_PER_S


def per_call_ms(
    spec: AllReduceSpec,
    gpu: GPUSpec,
    gpus: int,
    nccl_ms: Callable[[np.ndarray], np.ndarray],
    message_bytes: np.ndarray,
    *,
    graphed: bool,
) -> np.ndarray:
    """Milliseconds of one all-reduce of each message size.

    Args:
        spec: the engine's all-reduce settings.
        gpu: the GPU (its interconnect and link rate).
        gpus: GPUs taking part (the tensor-parallel degree).
        nccl_ms: NCCL device time (ms) at an array of message sizes (the calibration's curve).
        message_bytes: message sizes.
        graphed: inside a CUDA graph (no launch overhead) or eager.
    """
    size = np.asarray(message_bytes, float)
    algo = algorithms(spec, gpu, gpus, size)
    ms = np.asarray(nccl_ms(size), float).copy()
    launches = np.full(size.shape, EAGER_LAUNCHES["nccl"], float)
    for name in ("one_shot", "two_shot"):
        here = algo == name
        if here.any():
            fit, scale = custom_fit(gpu, gpus, name)
            ms[here] = fit.ms(size[here], scale)
            launches[here] = EAGER_LAUNCHES[name]
    return ms if graphed else ms + launches * LAUNCH_US * 1e-3


def bus_floor_ms(gpu: GPUSpec, gpus: int, message_bytes: np.ndarray) -> np.ndarray:
    """Bandwidth floor (ms): the 2 (n - 1)/n x S bytes a bandwidth-optimal all-reduce moves per GPU over its link."""
    return 2.0 * (gpus - 1) / gpus * np.asarray(message_bytes, float) / (gpu.nvlink_gb_per_s * 1e9) * 1e3
