"""Workload layer: arrival processes, length distributions and traces -> a RequestStream.

The engine only needs :func:`build_request_stream`; the rest is exported for tools
(``python -m sim traces fetch``) and tests.
"""

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

__all__ = [
    "DEFAULT_REQUESTS",
    "STREAMS",
    "TRACE_NAMES",
    "ClosedLoop",
    "RequestStream",
    "TraceInfo",
    "build_request_stream",
    "convert_azure_trace",
    "fetch_trace",
    "load_trace",
    "resolve_trace_path",
]
