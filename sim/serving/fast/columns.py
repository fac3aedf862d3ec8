"""The request records' columns as the fast path reads and writes them: one element at a time.

:class:`sim.metrics.records.RequestRecords` keeps its columns as numpy arrays (the tables are
made of them). Indexing a numpy array with one request id gives a numpy scalar, whose reads,
comparisons and writes cost about three times those of a Python int or float; a memoryview
over the same buffer gives plain Python numbers, and what is written through it is in the
array at once (the clients, routers and the tables read the arrays). The values are the same
bits either way: a float64 element is a Python float, an integer element a Python int.
"""

from __future__ import annotations

from typing import Protocol

from sim.metrics.records import RequestRecords


class IntColumn(Protocol):
    """An integer column, element by element (typeshed types a memoryview's items as ints only)."""

    def __getitem__(self, index: int) -> int: ...  # noqa: D105

    def __setitem__(self, index: int, value: int) -> None: ...  # noqa: D105


class FloatColumn(Protocol):
    """A float64 column, element by element."""

    def __getitem__(self, index: int) -> float: ...  # noqa: D105

    def __setitem__(self, index: int, value: float) -> None: ...  # noqa: D105


class RecordViews:
    """Memoryviews of the request columns the replicas touch per request (names as ``RequestRecords``'s).

    Args:
        records: the run's request records (its arrays are shared, not copied).
    """

    __slots__ = (
        "status", "replica", "arrival_s", "enqueued_s", "first_scheduled_s", "first_token_s", "completion_s",
        "generated_tokens", "preemptions",
    )  # fmt: skip

    status: IntColumn
    replica: IntColumn
    arrival_s: FloatColumn
    enqueued_s: FloatColumn
    first_scheduled_s: FloatColumn
    first_token_s: FloatColumn
    completion_s: FloatColumn
    generated_tokens: IntColumn
    preemptions: IntColumn

    def __init__(self, records: RequestRecords) -> None:
        for name in self.__slots__:
            setattr(self, name, memoryview(getattr(records, name)))
