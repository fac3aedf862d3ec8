"""The figures vLLM's ``benchmark_serving.py`` reports, as pure functions over a request frame.

The frame holds one row per request as the *client* saw it: ``output_len`` (the client's
token count of the text it received; 0 for an empty answer), ``ttft_s`` (send to first
text; benchmark_serving leaves it 0 when no text came), ``e2e_s`` (send to the end of the
stream) and ``completed`` (bool: the request succeeded). All sends are at t = 0 (a burst),
so the benchmark's wall-clock duration is the last request's end. benchmark_serving
(vLLM 0.6.0, ``calculate_metrics``) computes, over the successful requests:

- median TTFT over the requests with text (its summary's ``median_ttft_ms_nonzero``; its
  own ``median_ttft_ms`` counts the empty answers as 0);
- TPOT_r = (E2E_r - TTFT_r) / (output_len_r - 1) for requests with output_len_r > 1, then
  the median;
- median E2E over every request (empty answers included);
- duration D = last end; output tokens/s = sum(output_len) / D.

:func:`client_frame` builds such a frame from a simulated run's ``requests`` table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

METRICS: tuple[str, ...] = ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "output_tps", "duration_s")
"""The compared figures, in table order."""


def client_frame(requests: pd.DataFrame, output_len: np.ndarray) -> pd.DataFrame:
    """The client's view of a simulated run: its latencies with the client's output lengths.

    Args:
        requests: ``RunResult.requests`` of one policy (``request_id`` = index in the run).
        output_len: the client's output length per request index (0 = empty answer, which
            the replay simulated as one token).

    Returns:
        ``output_len, ttft_s, e2e_s, completed`` per request index; TTFT is 0 for an
        empty answer, as benchmark_serving records it.
    """
    ordered = requests.sort_values("request_id")
    output_len = np.asarray(output_len, dtype=np.int64)
    ttft_s = ordered["ttft_s"].to_numpy(dtype=np.float64)
    return pd.DataFrame({
        "output_len": output_len,
        "ttft_s": np.where(output_len > 0, ttft_s, 0.0),
        "e2e_s": ordered["e2e_s"].to_numpy(dtype=np.float64),
        "completed": (ordered["status"] == "completed").to_numpy(),
    })  # fmt: skip


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["completed"]] if "completed" in frame else frame


def median_ttft_ms(frame: pd.DataFrame) -> float:
    """Median TTFT in ms over successful requests with text (output_len > 0)."""
    ok = _ok(frame)
    return _median_ms(ok.loc[ok["output_len"] > 0, "ttft_s"])


def tpot_s(frame: pd.DataFrame) -> pd.Series:
    """Per-request TPOT (s/token) of successful requests with output_len > 1."""
    ok = _ok(frame)
    many = ok[ok["output_len"] > 1]
    return (many["e2e_s"] - many["ttft_s"]) / (many["output_len"] - 1)


def median_tpot_ms(frame: pd.DataFrame) -> float:
    """Median of :func:`tpot_s`, in ms."""
    return _median_ms(tpot_s(frame))


def median_e2e_ms(frame: pd.DataFrame) -> float:
    """Median end-to-end latency in ms over every successful request (empty answers included)."""
    return _median_ms(_ok(frame)["e2e_s"])


def duration_s(frame: pd.DataFrame) -> float:
    """Benchmark duration: the last request's end, all sends being at t = 0."""
    return float(np.nanmax(frame["e2e_s"].to_numpy(dtype=np.float64)))


def output_tps(frame: pd.DataFrame) -> float:
    """Output tokens/s: the client's output tokens of successful requests over the duration."""
    return float(_ok(frame)["output_len"].sum()) / duration_s(frame)


def benchmark_metrics(frame: pd.DataFrame) -> dict[str, float]:
    """Every figure of :data:`METRICS` for one run."""
    return {
        "ttft_p50_ms": median_ttft_ms(frame),
        "tpot_p50_ms": median_tpot_ms(frame),
        "e2e_p50_ms": median_e2e_ms(frame),
        "output_tps": output_tps(frame),
        "duration_s": duration_s(frame),
    }


def _median_ms(values: pd.Series) -> float:
    # benchmark_serving: np.median(x or 0) -- an empty set reports 0.
    return float(np.median(values.to_numpy(dtype=np.float64))) * 1e3 if len(values) else 0.0
