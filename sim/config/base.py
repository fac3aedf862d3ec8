"""Shared pieces of the scenario schema: strict frozen models, number types, and the bounds
that keep a run physical and its float64 clock exact."""


from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)

PositiveFloat = Annotated[float, Field(gt=0)]

# Bounds that keep a run physical and its clock exact. Simulated time is a float64: past
# ~1e9 s (31 years) a microsecond is no longer representable, so latencies would round to 0.
MAX_DURATION_S = 1e7
"""Longest time-like setting (think time, timeout, phase, warm-up): 116 days."""
MIN_RATE = 1e-6
"""Slowest arrival rate, requests/s (one request per 11.6 days)."""
MAX_RATE = 1e9
MAX_REQUESTS = 100_000_000
"""Most requests in one run: at ~600 bytes of records per request and policy, 60 GB."""
RECORD_BYTES_PER_REQUEST = 600
MAX_KV_BLOCKS = 1_000_000_000
"""Most KV blocks per worker (counts are int32 in the iteration records)."""
MAX_TOKENS = 10_000_000
"""Longest prompt or output of one request (the longest context windows are ~1e7 tokens)."""
"""Most KV blocks per worker (counts are int32 in the iteration records)."""


def _not_a_boolean(value: Any) -> Any:
    # YAML's `requests: true` would otherwise be read as 1.
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not the boolean {str(value).lower()}")
    return value


Int = Annotated[int, BeforeValidator(_not_a_boolean)]
"""An integer field: a boolean is an error, not 0 or 1."""
Float = Annotated[float, BeforeValidator(_not_a_boolean)]
"""A float field: a boolean is an error (inf and nan are refused by StrictModel)."""


class StrictModel(BaseModel):
    """Base for every config block: unknown keys and inf/nan are errors; instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


