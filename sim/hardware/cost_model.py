"""Per-iteration GPU time of one forward pass: the cost model the engine calls.

T(batch) = linear(N) + lm_head(R) + attention_prefill + attention_decode
           + all_reduce(N, graphed) + cpu_overhead(R),

with N = prefill chunk tokens + one token per decode sequence and R = sequences in the
batch (one sampled row each). Curves are monotone piecewise-linear in their argument
and the attention forms have non-negative coefficients, so the time never decreases
when tokens, context or sequences are added. See :mod:`sim.calibration.fitting` for the
forms and :func:`load_cost_model` for where the numbers come from. The all-reduce is priced
as the engine runs it (:mod:`sim.hardware.all_reduce`: vLLM's custom kernel or NCCL by
message size, in a CUDA graph or eager), from a policy's ``all_reduce`` settings
(:meth:`CostModel.with_all_reduce`).

The token- and row-indexed curves are also tabulated at every integer below
``TABLE_SIZE`` (:meth:`PiecewiseLinear.table`, bitwise equal to the curve), so the hot
path indexes a list instead of bisecting; larger counts fall back to the curve.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np

from sim.errors import UserError
from sim.hardware.all_reduce import AllReduceSpec, per_call_ms
from sim.hardware.calibration_files import (
    CALIBRATION_DIR,
    DECODE_TERMS,
    LICENCE,
    PREFILL_TERMS,
    ROOFLINE_FILE,
    calibration_filename,
    read_yaml,
    roofline_file_name,
)
from sim.hardware.catalog import GPUSpec, ModelSpec, check_tensor_parallel, get_gpu, get_model
from sim.hardware.curves import PiecewiseLinear
from sim.hardware.moe import check_expert_parallel
from sim.hardware.profiled_range import ProfiledRange
from sim.hardware.same_shape import load_same_shape
from sim.hardware.transfer import label_for, roofline_calibration

COMPONENTS = (
    "linear",
    "lm_head",
    "attention_prefill",
    "attention_decode",
    "all_reduce",
    "cpu_overhead",
)
_MS = 1e-3
TABLE_SIZE = 1 << 15
"""Integer arguments below this are priced by table lookup (32768 tokens or rows per pass)."""


class CostModel:
    """Iteration time of one (model, GPU, TP), built from a calibration dict.

    Args:
        calibration: a calibration file's content (or the same shape from the roofline).
        model: the model it describes (layers and hidden size scale per-layer terms).
        label: "calibrated", "transferred" or "uncalibrated (roofline)".
        source: provenance, recorded in scenario.resolved.yaml.
        cpu_overhead: add the engine's CPU time per iteration.
        gpu: the GPU (interconnect and link rate of the all-reduce); default: the calibration's ``gpu``.
        all_reduce: how the engine runs its all-reduces (default: vLLM v0's, :class:`AllReduceSpec`).

    Attributes:
        label: see above.
        source: see above.
        fit_error: held-out / transfer error per component, as in the calibration.
        num_layers: transformer blocks of the model (a per-layer share of a pass, e.g. an EAGLE head).
        all_reduce_spec: the all-reduce settings the tables were built for.
        profiled: the step shapes its fits were measured at (None: unknown); passes beyond them are
            priced by extrapolation (:mod:`sim.hardware.profiled_range`).
        gpu_time_scale: the factor its GPU terms carry (:meth:`scaled`; 1 as loaded).
    """

    profiled: ProfiledRange | None = None
    gpu_time_scale: float = 1.0

    def __init__(
        self,
        calibration: dict,
        model: ModelSpec,
        *,
        label: str,
        source: str,
        cpu_overhead: bool = True,
        gpu: GPUSpec | None = None,
        all_reduce: AllReduceSpec | None = None,
    ) -> None:
        self.label, self.source = label, source
        self.fit_error = calibration.get("fit_error", {})
        layers = self.num_layers = model.num_layers
        lin, lm = calibration["linear"], calibration["lm_head"]
        self._linear = PiecewiseLinear(lin["tokens"], lin["ms"]).scaled(y_scale=_MS)
        self._lm_head = PiecewiseLinear(lm["rows"], lm["ms"]).scaled(y_scale=_MS)
        self._model, self._ar_section = model, calibration.get("all_reduce") or None
        self._gpu = gpu if gpu is not None or not self._ar_section else get_gpu(calibration["gpu"])
        self._set_all_reduce(all_reduce or AllReduceSpec())
        cpu = calibration["cpu_overhead"]
        self._cpu = (
            PiecewiseLinear(cpu["batch_size"], cpu["ms"]).scaled(y_scale=_MS)
            if cpu_overhead
            else None
        )
        self._linear_t = self._linear.table(TABLE_SIZE)
        self._lm_head_t = self._lm_head.table(TABLE_SIZE)
        self._cpu_t = self._cpu.table(TABLE_SIZE) if self._cpu is not None else []
        dec, pre = calibration["attention"]["decode"], calibration["attention"]["prefill"]
        self._d0, self._d1, self._d2 = (layers * dec[k] * _MS for k in DECODE_TERMS)
        self._p0, self._p1, self._p2, self._p3 = (layers * pre[k] * _MS for k in PREFILL_TERMS)

    def _set_all_reduce(self, spec: AllReduceSpec) -> None:
        self.all_reduce_spec = spec
        self._graph_tokens, self._graph_mixed = spec.graph_max_tokens, spec.graph_mixed_batches
        self._ar = _AllReducePricing.build(self._ar_section, self._model, self._gpu, spec, self.gpu_time_scale)

    def scaled(self, factor: float) -> CostModel:
        """This cost model with every GPU term (linear ops, LM head, attention, all-reduce) times ``factor``,
        the CPU term unchanged: a per-GPU correction of the step cost fitted on real runs
        (``cost.step_scale``, docs/uncertainty.md). ``self`` when ``factor`` is 1.

        Raises:
            ValueError: ``factor`` is not a positive finite number.
        """
        if not (np.isfinite(factor) and factor > 0):
            raise ValueError(f"a GPU time scale must be a positive finite number, got {factor!r}")
        if factor == 1.0:
            return self
        other = copy.copy(self)
        other.gpu_time_scale = self.gpu_time_scale * factor
        other._linear, other._lm_head = self._linear.scaled(y_scale=factor), self._lm_head.scaled(y_scale=factor)
        other._linear_t, other._lm_head_t = other._linear.table(TABLE_SIZE), other._lm_head.table(TABLE_SIZE)
        other._d0, other._d1, other._d2 = (factor * v for v in (self._d0, self._d1, self._d2))
        other._p0, other._p1, other._p2, other._p3 = (factor * v for v in (self._p0, self._p1, self._p2, self._p3))
        other._set_all_reduce(self.all_reduce_spec)
        return other

    def with_all_reduce(self, spec: AllReduceSpec) -> CostModel:
        """This cost model with its all-reduces run as ``spec`` says (``self`` when it already does)."""
        if spec == self.all_reduce_spec:
            return self
        other = copy.copy(self)
        other._set_all_reduce(spec)
        return other

    def all_reduce_s(self, tokens: np.ndarray, prefill_seqs: np.ndarray) -> np.ndarray:
        """All-reduce seconds of passes of ``tokens`` tokens with ``prefill_seqs`` prefill pieces (vectorised;
        equal to the ``all_reduce`` entry of :meth:`breakdown_from_totals_s` pass by pass; 0 at TP 1)."""
        tokens = np.asarray(tokens)
        if self._ar is None:
            return np.zeros(tokens.shape)
        graphed = (tokens <= self._graph_tokens) & ((np.asarray(prefill_seqs) == 0) | self._graph_mixed)
        return self._ar.seconds(tokens, graphed)

    def time_from_totals_s(
        self,
        num_prefill_tokens: int,
        num_prefill_seqs: int,
        prefill_attn_work: float,
        num_decode_seqs: int,
        decode_kv_tokens: int,
    ) -> float:
        """Iteration time in seconds from batch totals (the engine's hot path).

        Args:
            num_prefill_tokens: sum of prefill chunk tokens (C).
            num_prefill_seqs: prefill pieces in the batch.
            prefill_attn_work: sum over pieces of chunk x (context + chunk / 2) (W).
            num_decode_seqs: decode sequences (one token each).
            decode_kv_tokens: sum of the decode sequences' context lengths.

        Returns:
            Seconds; 0.0 for an empty batch. Equal to :meth:`iteration_time_s` on the
            same batch.
        """
        tokens = num_prefill_tokens + num_decode_seqs
        if tokens <= 0:
            return 0.0
        rows = num_prefill_seqs + num_decode_seqs
        # Table lookups (bitwise equal to the curves) for int counts in range; else the curves.
        small = tokens.__class__ is int and rows.__class__ is int and tokens < TABLE_SIZE and 0 <= rows < TABLE_SIZE
        # Summed in COMPONENTS order so the breakdown adds up to exactly this value.
        if small:
            total = self._linear_t[tokens] + self._lm_head_t[rows]
        else:
            total = self._linear(tokens) + self._lm_head(rows)
        if num_prefill_seqs > 0:
            sq_tokens = min(2.0 * prefill_attn_work, float(num_prefill_tokens) * num_prefill_tokens)
            total += (
                self._p0
                + self._p1 * num_prefill_tokens
                + self._p2 * prefill_attn_work
                + self._p3 * sq_tokens
            )
        if num_decode_seqs > 0:
            total += self._d0 + self._d1 * num_decode_seqs + self._d2 * decode_kv_tokens
        if self._ar is not None:
            graphed = tokens <= self._graph_tokens and (num_prefill_seqs == 0 or self._graph_mixed)
            if small:
                total += (self._ar.graph_t if graphed else self._ar.eager_t)[tokens]
            else:
                total += self._ar.pass_s(tokens, graphed)
        if self._cpu is not None:
            total += self._cpu_t[rows] if small and self._cpu_t else self._cpu(rows)
        return total

    def decode_terms(self, num_decode_seqs: int) -> tuple[float, float, float, float, float] | None:
        """The terms of a pure decode pass of ``num_decode_seqs`` sequences that do not depend on its KV.

        For every int ``kv``, ``((a + (b + d2 * kv)) + c) + e`` is ``time_from_totals_s(0, 0, 0.0,
        num_decode_seqs, kv)`` to the last bit (the same operations in the same order; ``c``, ``e`` are 0.0
        without all-reduces or CPU time), so a run of decode passes is priced without a call per pass.

        Returns:
            (a, b, d2, c, e), or None when such a pass is not priced from the tables.
        """
        n = num_decode_seqs
        if n.__class__ is not int or not 0 < n < TABLE_SIZE:
            return None
        a = self._linear_t[n] + self._lm_head_t[n]
        b = self._d0 + self._d1 * n
        c = 0.0 if self._ar is None else (self._ar.graph_t if n <= self._graph_tokens else self._ar.eager_t)[n]
        e = 0.0 if self._cpu is None else (self._cpu_t[n] if self._cpu_t else self._cpu(n))
        return a, b, self._d2, c, e

    def iteration_time_s(
        self,
        prefill_chunk_tokens: np.ndarray,
        prefill_context_tokens: np.ndarray,
        decode_context_tokens: np.ndarray,
        *,
        breakdown: bool = False,
    ) -> float | tuple[float, dict[str, float]]:
        """Time of one forward pass over prefill pieces and decode sequences.

        Args:
            prefill_chunk_tokens: tokens each prefill piece computes this iteration.
            prefill_context_tokens: tokens each piece already has in cache before its chunk.
            decode_context_tokens: tokens each decode sequence has in cache.
            breakdown: also return seconds per component (keys of ``COMPONENTS``
                that apply), summing to the total.

        Returns:
            Seconds, or (seconds, breakdown) when ``breakdown`` is true.
        """
        totals = _totals(prefill_chunk_tokens, prefill_context_tokens, decode_context_tokens)
        total = self.time_from_totals_s(*totals)
        if not breakdown:
            return total
        return total, self.breakdown_from_totals_s(*totals)

    def breakdown_from_totals_s(
        self,
        num_prefill_tokens: int,
        num_prefill_seqs: int,
        prefill_attn_work: float,
        num_decode_seqs: int,
        decode_kv_tokens: int,
    ) -> dict[str, float]:
        """Seconds per component for the batch totals of :meth:`time_from_totals_s`."""
        tokens = num_prefill_tokens + num_decode_seqs
        if tokens <= 0:
            return {}
        rows = num_prefill_seqs + num_decode_seqs
        parts = {"linear": self._linear(tokens), "lm_head": self._lm_head(rows)}
        if num_prefill_seqs > 0:
            sq_tokens = min(2.0 * prefill_attn_work, float(num_prefill_tokens) * num_prefill_tokens)
            parts["attention_prefill"] = (
                self._p0
                + self._p1 * num_prefill_tokens
                + self._p2 * prefill_attn_work
                + self._p3 * sq_tokens
            )
        if num_decode_seqs > 0:
            parts["attention_decode"] = (
                self._d0 + self._d1 * num_decode_seqs + self._d2 * decode_kv_tokens
            )
        if self._ar is not None:
            graphed = tokens <= self._graph_tokens and (num_prefill_seqs == 0 or self._graph_mixed)
            parts["all_reduce"] = self._ar.pass_s(tokens, graphed)
        if self._cpu is not None:
            parts["cpu_overhead"] = self._cpu(rows)
        return parts

    def __repr__(self) -> str:
        return f"CostModel(label={self.label!r}, source={self.source!r})"


def _totals(
    chunk: np.ndarray, context: np.ndarray, decode: np.ndarray
) -> tuple[int, int, float, int, int]:
    chunk, context, decode = np.asarray(chunk), np.asarray(context), np.asarray(decode)
    if chunk.shape != context.shape:
        raise ValueError(
            "prefill_chunk_tokens and prefill_context_tokens must have the same length"
        )
    if chunk.size:
        work = float(np.dot(chunk, context + 0.5 * chunk))
        prefill = (int(chunk.sum()), int(chunk.size), work)
    else:
        prefill = (0, 0, 0.0)
    return (*prefill, int(decode.size), int(decode.sum()) if decode.size else 0)


class _AllReducePricing:
    """Per-pass all-reduce seconds by token count, in a CUDA graph and eager (:mod:`sim.hardware.all_reduce`).

    Two all-reduces per layer of tokens x hidden x dtype bytes; each table is the upper envelope of the per-pass
    time over token counts, so it never decreases when a token is added. Counts at or past ``TABLE_SIZE`` take
    the envelope's last value or the time at that count, whichever is larger.
    """

    def __init__(self, price: Callable[[np.ndarray, bool], np.ndarray]) -> None:
        self._price = price
        tokens = np.arange(TABLE_SIZE, dtype=np.float64)
        self.graph = np.maximum.accumulate(price(tokens, True))
        self.eager = np.maximum.accumulate(price(tokens, False))
        self.graph_t, self.eager_t = self.graph.tolist(), self.eager.tolist()

    @classmethod
    def build(
        cls, section: dict | None, model: ModelSpec, gpu: GPUSpec | None, spec: AllReduceSpec, scale: float = 1.0
    ) -> _AllReducePricing | None:
        """The tables for a calibration's ``all_reduce`` section (None at TP 1: nothing to reduce), times ``scale``."""
        if not section:
            return None
        assert gpu is not None, "an all-reduce section needs its GPU"
        gpus = int(section["gpus"])
        nccl_ms = PiecewiseLinear(section["message_bytes"], section["ms"]).at  # message bytes -> ms of one call
        per_token_bytes = float(model.hidden_size * model.dtype_bytes)
        calls_s = 2 * model.num_layers * _MS * scale  # two all-reduces per layer, ms -> s

        def price(tokens: np.ndarray, graphed: bool) -> np.ndarray:
            return calls_s * per_call_ms(spec, gpu, gpus, nccl_ms, tokens * per_token_bytes, graphed=graphed)

        return cls(price)

    def pass_s(self, tokens: float, graphed: bool) -> float:
        """Seconds of one pass of ``tokens`` tokens."""
        table = self.graph_t if graphed else self.eager_t
        if tokens.__class__ is int and 0 <= tokens < TABLE_SIZE:
            return table[tokens]
        floor = table[min(max(int(tokens), 0), TABLE_SIZE - 1)]
        return max(floor, float(self._price(np.array([float(tokens)]), graphed)[0]))

    def seconds(self, tokens: np.ndarray, graphed: np.ndarray) -> np.ndarray:
        """:meth:`pass_s` of every pass (arrays of token counts and graph flags)."""
        tokens = np.asarray(tokens)
        index = np.clip(tokens, 0, TABLE_SIZE - 1).astype(np.int64)
        out = np.where(graphed, self.graph[index], self.eager[index])
        for i in np.flatnonzero((tokens >= TABLE_SIZE) | (tokens != index)):  # rare: past the table, or fractional
            out[i] = self.pass_s(float(tokens[i]), bool(graphed[i]))
        return out


def calibrated_configs() -> list[tuple[str, str, int]]:
    """The (model, GPU, TP) triples with a committed calibration file, sorted."""
    found = []
    for path in CALIBRATION_DIR.glob("*_tp*.yaml"):
        model, _, rest = path.stem.partition("_")
        gpu, _, tp = rest.rpartition("_tp")
        if gpu and tp.isdigit():
            found.append((model, gpu, int(tp)))
    return sorted(found)


def load_cost_model(
    model: str,
    gpu: str,
    tensor_parallel: int,
    *,
    cpu_overhead: bool = True,
    expert_parallel: int = 1,
    all_reduce: AllReduceSpec | None = None,
) -> CostModel:
    """The cost model of ``model`` on ``tensor_parallel`` x ``gpu``.

    A committed calibration of (model, GPU, TP) gives label "calibrated"; one of a model with the same
    layer shapes gives "same-shape (<that model>)" (:mod:`sim.hardware.same_shape`); A100-80GB
    without one gives the roofline with A100-fitted efficiencies ("transferred"); H100
    and A40 the roofline with efficiencies fitted on their own linear-op profiles
    ("transferred (h100 profiles)", "transferred (a40 profiles)"); any other GPU the A100
    roofline on its datasheet roofs ("uncalibrated (roofline)"). Mixture-of-experts models
    (never profiled) take the roofline path with "MoE" in the label and their routed experts
    split into ``expert_parallel`` groups (:mod:`sim.hardware.moe`). ``all_reduce`` says how the
    engine runs its all-reduces (default: :class:`~sim.hardware.all_reduce.AllReduceSpec`, vLLM v0).

    Raises:
        UserError: unknown model or GPU, TP that does not divide the heads or has no
            all-reduce profile, an expert-parallel degree that does not divide TP or the
            experts, or an unreadable calibration file.
    """
    spec, gpu_spec = get_model(model), get_gpu(gpu)
    check_tensor_parallel(spec, tensor_parallel)
    check_expert_parallel(spec, tensor_parallel, expert_parallel)
    moe_model = spec.moe is not None
    path = CALIBRATION_DIR / calibration_filename(model, gpu, tensor_parallel)
    if path.is_file():
        data = read_yaml(path)
        source = f"{path.name} ({data.get('source', LICENCE)})"
        return _build(data, spec, "calibrated", source, (cpu_overhead, gpu_spec, all_reduce), path)
    borrowed = load_same_shape(spec, gpu, tensor_parallel)  # a calibrated model with these layer shapes
    if borrowed is not None:
        data, label, source, twin_path = borrowed
        return _build(data, spec, label, source, (cpu_overhead, gpu_spec, all_reduce), twin_path)
    own_roof = CALIBRATION_DIR / roofline_file_name(gpu)
    if own_roof.is_file():  # a profiled GPU: efficiencies fitted on its own linear ops
        roof = read_yaml(own_roof)
        data = roofline_calibration(roof, spec, gpu_spec, tensor_parallel, expert_parallel)
        source = f"roofline on {gpu} with efficiencies from {own_roof.name} ({roof['source']})"
        label = label_for(gpu_spec, gpu, moe_model=moe_model)
        return _build(data, spec, label, source, (cpu_overhead, gpu_spec, all_reduce), own_roof)
    roof_path = CALIBRATION_DIR / ROOFLINE_FILE
    data = roofline_calibration(read_yaml(roof_path), spec, gpu_spec, tensor_parallel, expert_parallel)
    label = label_for(gpu_spec, moe_model=moe_model)
    source = f"roofline on {gpu} datasheet roofs with efficiencies from {ROOFLINE_FILE} ({LICENCE})"
    return _build(data, spec, label, source, (cpu_overhead, gpu_spec, all_reduce), roof_path)


def _build(
    data: dict,
    spec: ModelSpec,
    label: str,
    source: str,
    options: tuple[bool, GPUSpec, AllReduceSpec | None],
    path: object,
) -> CostModel:
    cpu_overhead, gpu, all_reduce = options
    try:
        model = CostModel(data, spec, label=label, source=source, cpu_overhead=cpu_overhead, gpu=gpu,
                          all_reduce=all_reduce)  # fmt: skip
        # A calibration's (or its same-shape twin's) linear knots are profiled token counts; a roofline's are a grid.
        model.profiled = ProfiledRange.of(data, profiled_linear=label == "calibrated" or label.startswith("same-shape"))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise UserError(f"{path}: corrupt calibration ({type(exc).__name__}: {exc})") from None
    return model
