"""Benchmark tools' JSON results as replayable cases: vLLM ``benchmark_serving --save-result`` and GuideLLM.

Both record every request's lengths and latencies as the client saw them, but not the server: its GPU,
engine version and flags come from the file's own metadata where the tool kept some (benchmark_serving's
``--metadata KEY=VALUE`` becomes top-level keys; GuideLLM's ``--output-extras`` a benchmark's ``extras``),
else from the defaults the command is given (``--gpu``, ``--engine-version``, ...), with the columns of
:data:`sim.validation.server.COLUMN_NAMES` as keys. A missing ``max_model_len`` is the model's context
window (vLLM's default).

- **vLLM** ``benchmarks/benchmark_serving.py --save-result`` (vllm-project/vllm, ``main`` and
  ``benchmark_serving`` of 0.6-0.10): ``input_lens``, ``output_lens``, ``ttfts`` (s) and ``itls`` (s, one
  list per request), ``errors`` (empty where the request succeeded), ``duration``, ``request_rate``
  (``"inf"``: all sent at once), ``burstiness``, ``max_concurrency``, ``model_id``. A request's E2E is its
  TTFT plus its inter-token gaps. Sends at ``inf`` replay as a burst (or a closed loop of
  ``max_concurrency`` clients); at a finite rate as Poisson (gamma for burstiness != 1) sends of that rate,
  drawn with a fixed seed (the tool does not record its send times).
- **GuideLLM** JSON report (vllm-project/guidellm 0.2-0.3 ``GenerativeBenchmarksReport``): ``benchmarks``,
  each one run with ``requests.successful`` (``prompt_tokens``, ``output_tokens``, ``start_time``,
  ``first_token_time``, ``end_time``, epoch s) and ``args.strategy`` (``type_`` synchronous, concurrent
  with ``streams``, throughput, constant or poisson). Replayed at the recorded send times, a synchronous
  or concurrent benchmark as a closed loop of its streams. A benchmark whose requests were sampled
  (``request_samples``) holds too few to replay and is refused.

Compared per run: the medians of TTFT, TPOT ((E2E - TTFT) / (output - 1), requests with > 1 token) and E2E,
and output tokens/s over the run (last end - first send). Every field is checked before anything is
simulated; a problem is one :class:`~sim.errors.UserError` naming the file and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.errors import UserError, shown
from sim.io.yaml_reader import read_text_file
from sim.validation.cases import Case, Residual, completed
from sim.validation.server import COLUMN_NAMES, read_server_flags
from sim.workload.traces import ARRIVAL_COLUMN, OUTPUT_COLUMN, PROMPT_COLUMN

UNITS = {"ttft_p50_ms": "ms", "tpot_p50_ms": "ms/token", "e2e_p50_ms": "ms", "output_tps": "tokens/s"}
VLLM_REQUIRED = ("input_lens", "output_lens", "ttfts", "itls")
GUIDELLM_REQUEST_FIELDS = ("prompt_tokens", "output_tokens", "start_time", "first_token_time", "end_time")
SKIPPED_SUFFIX = ".pytorch.json"
"""benchmark_serving's companion file (the same run in PyTorch's benchmark format): not read."""


@dataclass(frozen=True, kw_only=True)
class BenchmarkFileCase(Case):
    """One run of a benchmark tool's JSON: its requests in send order, how they were sent, what the tool measured.

    Attributes:
        requests: ``input_len``, ``output_len`` (engine tokens, >= 1), ``send_s`` (from the first send).
        arrival: extra fields of the replay's trace arrival (``concurrency`` for a closed loop).
        measured: the run's figures, keyed as :data:`UNITS`.
    """

    requests: pd.DataFrame
    arrival: dict[str, Any]
    measured: dict[str, float]

    def workload(self, folder: Path) -> dict[str, Any]:
        """The run's requests at their send times (or as a closed loop), as a batchsim trace in ``folder``."""
        path = folder / "benchmark_trace.csv"
        pd.DataFrame({
            ARRIVAL_COLUMN: self.requests["send_s"].to_numpy(),
            PROMPT_COLUMN: self.requests["input_len"].to_numpy(),
            OUTPUT_COLUMN: self.requests["output_len"].to_numpy(),
        }).to_csv(path, index=False)  # fmt: skip
        return {"arrival": {"kind": "trace", "path": str(path), **self.arrival}, "text": "random"}

    def compare(self, requests: pd.DataFrame) -> list[Residual]:
        """The tool's figures against the same figures of the replay."""
        simulated = client_figures(completed(requests))
        return [Residual(m, unit, self.measured[m], simulated[m]) for m, unit in UNITS.items()]


def client_figures(done: pd.DataFrame) -> dict[str, float]:
    """Median TTFT, TPOT and E2E (ms) and output tokens/s of completed requests (``ttft_s``, ``e2e_s``,
    ``output_tokens``, ``arrival_s``, ``completion_s`` columns)."""
    ttft, e2e = done["ttft_s"].to_numpy(dtype=float), done["e2e_s"].to_numpy(dtype=float)
    out = done["output_tokens"].to_numpy(dtype=float)
    many = out > 1
    tpot = (e2e[many] - ttft[many]) / (out[many] - 1)
    span = float(done["completion_s"].max() - done["arrival_s"].min()) if len(done) else math.nan
    return {
        "ttft_p50_ms": _median_ms(ttft), "tpot_p50_ms": _median_ms(tpot), "e2e_p50_ms": _median_ms(e2e),
        "output_tps": float(out.sum()) / span if span > 0 else math.nan,
    }  # fmt: skip


def _median_ms(values: np.ndarray) -> float:
    return float(np.median(values)) * 1e3 if len(values) else math.nan


# --------------------------------------------------------------------------- reading
def read_json(path: Path) -> Any:
    """A JSON file's content.

    Raises:
        UserError: unreadable, over the size limit, or not JSON (naming the line).
    """
    text = read_text_file(path, max_bytes=512 * 2**20, what="benchmark result")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def cases_of_json(
    path: Path, defaults: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> list[BenchmarkFileCase]:
    """The runs of one tool's JSON file, its tool told by its keys.

    Args:
        path: the file.
        defaults: server flags for what the file does not record (keys of ``COLUMN_NAMES``).
        overrides: server flags that win over the file's own (a model the file names by a local path).

    Raises:
        UserError: a file of neither tool, or any field check (naming the file and the field).
    """
    document = read_json(path)
    server = _Server(dict(defaults), dict(overrides or {}))
    if isinstance(document, Mapping) and "benchmarks" in document:
        return guidellm_cases(document, path, server)
    if isinstance(document, Mapping) and any(key in document for key in VLLM_REQUIRED):
        return [vllm_case(document, path, server)]
    raise UserError(
        f"{path}: not a benchmark result batchsim reads: expected vLLM benchmark_serving --save-result JSON "
        f"(keys {', '.join(VLLM_REQUIRED)}) or a GuideLLM JSON report (key 'benchmarks')"
    )


@dataclass(frozen=True)
class _Server:
    """Server flags from the command: ``defaults`` under a file's own, ``overrides`` over them."""

    defaults: dict[str, Any]
    overrides: dict[str, Any]

    def flags(self, recorded: Mapping[str, Any]) -> dict[str, Any]:
        """The flags of a run whose file records ``recorded`` (only the keys of ``COLUMN_NAMES`` are taken)."""
        own = {k: v for k, v in recorded.items() if k in _FLAG_KEYS and v is not None}
        return {**self.defaults, **own, **self.overrides}


def vllm_case(document: Mapping[str, Any], path: Path, server: _Server) -> BenchmarkFileCase:
    """One benchmark_serving result (see module)."""
    for key in VLLM_REQUIRED:
        if key not in document:
            raise UserError(f"{path}: field {key!r} missing; benchmark_serving writes it with --save-result "
                            "(newer versions: add --save-detailed)")  # fmt: skip
    inputs = _numbers(document["input_lens"], path, "input_lens", whole=True, minimum=1)
    outputs = _numbers(document["output_lens"], path, "output_lens", whole=True, minimum=0)
    ttfts = _numbers(document["ttfts"], path, "ttfts", minimum=0)
    gaps = _gap_sums(document["itls"], path)
    errors = document.get("errors") or [""] * len(inputs)
    _same_length(path, input_lens=inputs, output_lens=outputs, ttfts=ttfts, itls=gaps, errors=errors)
    ok = np.array([not e for e in errors]) & (outputs > 0)
    if not ok.any():
        raise UserError(f"{path}: no request succeeded with output (errors and output_lens)")
    e2e = ttfts + gaps
    sends, arrival = _vllm_sends(document, path, int(ok.sum()))
    requests = pd.DataFrame({"input_len": inputs[ok], "output_len": outputs[ok], "send_s": sends})
    frame = pd.DataFrame({"ttft_s": ttfts[ok], "e2e_s": e2e[ok], "output_tokens": outputs[ok],
                          "arrival_s": sends, "completion_s": sends + e2e[ok]})  # fmt: skip
    measured = client_figures(frame)
    if isinstance(document.get("output_throughput"), (int, float)):
        measured["output_tps"] = float(document["output_throughput"])  # the tool's own figure
    return _case(path, path.stem, server.flags(document), requests, arrival, measured)


def _vllm_sends(document: Mapping[str, Any], path: Path, count: int) -> tuple[np.ndarray, dict[str, Any]]:
    """Send times and the arrival fields of a benchmark_serving run (see module)."""
    rate = document.get("request_rate", "inf")
    concurrency = document.get("max_concurrency")
    if concurrency is not None and not (isinstance(concurrency, int) and concurrency >= 1):
        raise UserError(f"{path}: max_concurrency = {shown(concurrency)}: must be a whole number >= 1 or null")
    if rate in ("inf", None) or (isinstance(rate, (int, float)) and math.isinf(rate)):
        return np.zeros(count), ({"concurrency": concurrency} if concurrency else {})
    if not (isinstance(rate, (int, float)) and rate > 0):
        raise UserError(f"{path}: request_rate = {shown(rate)}: must be a number > 0 or 'inf'")
    if concurrency:
        raise UserError(f"{path}: max_concurrency = {concurrency} with request_rate = {rate}: sends both paced and "
                        "capped are not replayed; calibrate from runs with one of them")  # fmt: skip
    burstiness = document.get("burstiness", 1.0) or 1.0
    if not (isinstance(burstiness, (int, float)) and burstiness > 0):
        raise UserError(f"{path}: burstiness = {shown(burstiness)}: must be a number > 0")
    from sim.rng import RandomStreams

    generator = RandomStreams(0).generator(f"benchmark-sends/{path.name}")
    gaps = generator.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    return np.concatenate(([0.0], np.cumsum(gaps[:-1]))), {}


def guidellm_cases(document: Mapping[str, Any], path: Path, server: _Server) -> list[BenchmarkFileCase]:
    """Every benchmark of a GuideLLM report (see module)."""
    benchmarks = document["benchmarks"]
    if not isinstance(benchmarks, list) or not benchmarks:
        raise UserError(f"{path}: field 'benchmarks' = {shown(benchmarks)}: must be a non-empty list")
    return [_guidellm_case(b, path, f"benchmarks[{i}]", server) for i, b in enumerate(benchmarks)]


def _guidellm_case(benchmark: Any, path: Path, where: str, server: _Server) -> BenchmarkFileCase:
    if not isinstance(benchmark, Mapping):
        raise UserError(f"{path}: {where} = {shown(benchmark)}: must be a mapping")
    if benchmark.get("request_samples"):
        raise UserError(f"{path}: {where}.request_samples = {shown(benchmark['request_samples'])}: the requests were "
                        "sampled; rerun GuideLLM without --output-sampling to keep them all")  # fmt: skip
    successful = _mapping_of(benchmark, "requests").get("successful")
    if not isinstance(successful, list) or not successful:
        raise UserError(f"{path}: {where}.requests.successful: missing or empty; expected the list of requests")
    columns = {f: _request_field(successful, f, path, f"{where}.requests.successful") for f in GUIDELLM_REQUEST_FIELDS}
    order = np.argsort(columns["start_time"], kind="stable")
    start, first, end = (columns[f][order] for f in ("start_time", "first_token_time", "end_time"))
    outputs = columns["output_tokens"][order].astype(np.int64)
    for name, early, late in (("first_token_time", start, first), ("end_time", first, end)):
        wrong = np.flatnonzero(late < early)
        if wrong.size:
            raise UserError(f"{path}: {where}.requests.successful[{int(order[wrong[0]])}].{name}: earlier than the "
                            "time before it")  # fmt: skip
    sends = start - start[0]
    frame = pd.DataFrame({"ttft_s": first - start, "e2e_s": end - start, "output_tokens": outputs,
                          "arrival_s": sends, "completion_s": end - start[0]})  # fmt: skip
    requests = pd.DataFrame({"input_len": columns["prompt_tokens"][order].astype(np.int64),
                             "output_len": np.maximum(outputs, 1), "send_s": sends})  # fmt: skip
    arrival = _guidellm_arrival(benchmark, path, where)
    recorded = {"model_id": _mapping_of(benchmark, "worker").get("backend_model"), **_mapping_of(benchmark, "extras")}
    return _case(path, f"{path.stem}:{where}", server.flags(recorded), requests, arrival, client_figures(frame))


def _mapping_of(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``parent[key]`` where it is a mapping, else an empty one."""
    value = parent.get(key)
    return value if isinstance(value, Mapping) else {}


def _guidellm_arrival(benchmark: Mapping[str, Any], path: Path, where: str) -> dict[str, Any]:
    strategy = _mapping_of(benchmark, "args").get("strategy")
    if not isinstance(strategy, Mapping) or "type_" not in strategy:
        raise UserError(f"{path}: {where}.args.strategy.type_: missing; expected synchronous, concurrent, throughput, "
                        "constant or poisson")  # fmt: skip
    kind = strategy["type_"]
    if kind == "synchronous":
        return {"concurrency": 1}
    if kind == "concurrent":
        streams = strategy.get("streams")
        if not (isinstance(streams, int) and streams >= 1):
            raise UserError(f"{path}: {where}.args.strategy.streams = {shown(streams)}: must be a whole number >= 1")
        return {"concurrency": streams}
    if kind in ("throughput", "constant", "poisson", "async_constant", "async_poisson"):
        return {}  # replayed at the recorded send times
    raise UserError(f"{path}: {where}.args.strategy.type_ = {shown(kind)}: unknown; expected synchronous, concurrent, "
                    "throughput, constant or poisson")  # fmt: skip


# --------------------------------------------------------------------------- checks
_FLAG_KEYS = frozenset(name for names in COLUMN_NAMES.values() for name in names)


def _case(path: Path, name: str, metadata: dict[str, Any], requests: pd.DataFrame, arrival: dict[str, Any],
          measured: dict[str, float]) -> BenchmarkFileCase:  # fmt: skip
    if "max_model_len" not in metadata and "model_id" in metadata:
        metadata["max_model_len"] = _context_window(str(metadata["model_id"]))
    frame = pd.DataFrame([{k: str(v) for k, v in metadata.items()}])
    flags = read_server_flags(frame, 0, path, {})
    source = f"{path.name} (server: {', '.join(f'{k}={v}' for k, v in sorted(metadata.items()))})"
    return BenchmarkFileCase(shape="benchmark", name=name, flags=flags, n=len(requests), source=source,
                             requests=requests, arrival=arrival, measured=measured)  # fmt: skip


def _context_window(model_id: str) -> int | None:
    from sim.hardware.catalog import MODELS
    from sim.validation.server import MODELS as KNOWN

    name = KNOWN.get(model_id) or (model_id if model_id in MODELS else None)
    name = name or next((n for n, spec in MODELS.items() if spec.hf_name == model_id), None)
    return MODELS[name].max_positions if name else None


def _numbers(values: Any, path: Path, field: str, *, minimum: float, whole: bool = False) -> np.ndarray:
    if not isinstance(values, list) or not values:
        raise UserError(f"{path}: field {field!r} = {shown(values)}: must be a non-empty list of numbers")
    for index, value in enumerate(values):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and value >= minimum and (not whole or float(value).is_integer())
        if not ok:
            kind = "a whole number" if whole else "a number"
            raise UserError(f"{path}: {field}[{index}] = {shown(value)}: must be {kind} >= {minimum:g}")
    return np.asarray(values, dtype=np.int64 if whole else np.float64)


def _gap_sums(itls: Any, path: Path) -> np.ndarray:
    if not isinstance(itls, list) or not itls:
        raise UserError(f"{path}: field 'itls' = {shown(itls)}: must be a list of lists of seconds, one per request")
    sums = []
    for index, gaps in enumerate(itls):
        if not isinstance(gaps, list):
            raise UserError(f"{path}: itls[{index}] = {shown(gaps)}: must be a list of seconds")
        sums.append(float(_numbers(gaps, path, f"itls[{index}]", minimum=0).sum()) if gaps else 0.0)
    return np.asarray(sums)


def _request_field(requests: list[Any], field: str, path: Path, where: str) -> np.ndarray:
    values = []
    for index, request in enumerate(requests):
        value = request.get(field) if isinstance(request, Mapping) else None
        minimum = 1 if field == "prompt_tokens" else 0
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and value >= minimum):  # fmt: skip
            raise UserError(f"{path}: {where}[{index}].{field} = {shown(value)}: must be a number >= {minimum}")
        values.append(float(value))
    return np.asarray(values)


def _same_length(path: Path, **fields: Any) -> None:
    lengths = {name: len(values) for name, values in fields.items()}
    if len(set(lengths.values())) > 1:
        raise UserError(f"{path}: fields differ in length ({', '.join(f'{k} {v}' for k, v in lengths.items())}); "
                        "each must hold one entry per request")  # fmt: skip
