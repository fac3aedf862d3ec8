"""Workload layer: arrival processes, length distributions and traces -> a RequestStream.

The engine only needs :func:`build_request_stream`; the rest is exported for tools
(``python -m sim traces fetch``) and tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.lazy import lazy_attributes

_SOURCE = ("DEFAULT_REQUESTS", "STREAMS", "build_request_stream")
_STREAM = ("ClosedLoop", "RequestStream")
_TRACES = ("TRACE_NAMES", "TraceInfo", "convert_azure_trace", "fetch_trace", "load_trace", "resolve_trace_path")
__all__ = [  # noqa: RUF022 - grouped by home module
    "DEFAULT_REQUESTS", "STREAMS", "build_request_stream",
    "ClosedLoop", "RequestStream",
    "TRACE_NAMES", "TraceInfo", "convert_azure_trace", "fetch_trace", "load_trace", "resolve_trace_path",
]
__getattr__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(_SOURCE, "sim.workload.source"),
        **dict.fromkeys(_STREAM, "sim.workload.stream"),
        **dict.fromkeys(_TRACES, "sim.workload.traces"),
    },
)

if TYPE_CHECKING:
    from sim.workload.source import DEFAULT_REQUESTS, STREAMS, build_request_stream
    from sim.workload.stream import ClosedLoop, RequestStream
    from sim.workload.traces import (
        TRACE_NAMES,
        TraceInfo,
        convert_azure_trace,
        fetch_trace,
        load_trace,
        resolve_trace_path,
    )
