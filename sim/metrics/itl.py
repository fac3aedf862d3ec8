"""Inter-token latency (ITL): gaps between consecutive stream events of a request.

As in vLLM's ``benchmark_serving``, the ITL of a streamed request is the time between two
consecutive chunks it receives: after its first token (TTFT), each decode pass, or each
block of ``num_scheduler_steps`` passes (one chunk of K tokens), or the re-prefill that
resumes it after a preemption. All requests that receive tokens at one event and had
their previous tokens at the same earlier event share one gap, so the engine records
weighted gaps ``(gap_s, count)``: O(1) entries per event, however large the batch (the
common one, members that had the previous event too, costs 8 bytes: the event's time).

Statistics are those of the expanded multiset (each gap repeated ``count`` times), with
the percentile convention of :func:`sim.metrics.summary.percentile` (numpy's linear
interpolation), computed without expanding it.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np
import pandas as pd

ITL_COLUMNS: tuple[str, ...] = ("gap_s", "count")
"""Columns of ``SimOutput.itl``."""

ITL_PERCENTILES: tuple[int, ...] = (50, 90, 99)


class ITLRecorder:
    """Weighted gaps of one run (all replicas).

    Two kinds of entries: single ``add(gap_s, count)`` calls, and per decode group an
    :class:`EventStream` of its stream events (8 bytes per event: the veterans' gap is the
    time since the previous event, their count changes only when members come and go).
    """

    def __init__(self) -> None:
        self._new_buffers()

    def _new_buffers(self) -> None:
        self._gaps = array("d")
        self._counts = array("i")
        self._streams: list[EventStream] = []

    def __len__(self) -> int:
        """Entries recorded so far (events without veterans included)."""
        return len(self._gaps) + sum(len(stream.times) + len(stream.gaps) for stream in self._streams)

    def add(self, gap_s: float, count: int) -> None:
        """``count`` requests received tokens ``gap_s`` after their previous ones."""
        self._gaps.append(gap_s)
        self._counts.append(count)

    def new_stream(self) -> EventStream:
        """A stream for one decode group's events, included in :meth:`to_frame`."""
        stream = EventStream()
        self._streams.append(stream)
        return stream

    def to_frame(self) -> pd.DataFrame:
        """The gaps as a DataFrame (``ITL_COLUMNS``: float64 gap_s, int64 count >= 1).

        Rows are grouped by source, not in time order. The recorder is emptied. The gaps are
        copied first, then the event times (most of the memory) are given back, then the
        counts are filled, with temporaries bounded by slices of events.
        """
        plain = _WeightedGaps(self._gaps, self._counts)
        sources: list[_WeightedGaps | EventStream] = [plain, *self._streams]
        self._new_buffers()
        total = sum(source.kept() for source in sources)
        gaps = np.empty(total, dtype=np.float64)
        at = 0
        for source in sources:
            at = source.copy_gaps(gaps, at)
            source.release_times()
        counts = np.empty(total, dtype=np.int64)
        at = 0
        while sources:
            at = sources.pop(0).copy_counts(counts, at)
        return pd.DataFrame({"gap_s": gaps, "count": counts}, copy=False)


_EVENTS_PER_SLICE = 1 << 20


class _WeightedGaps:
    """Gaps with their counts (``array`` buffers), as ``ITLRecorder.add`` and a stream's joiners record them."""

    def __init__(self, gaps: array, counts: array) -> None:
        self._gaps, self._counts = gaps, counts

    def kept(self) -> int:
        """Entries with a positive count (the rows they become)."""
        return int(np.count_nonzero(np.frombuffer(self._counts, dtype=np.int32) > 0))

    def copy_gaps(self, gaps: np.ndarray, at: int) -> int:
        """Write the kept entries' gaps into ``gaps`` from ``at``; return where they end."""
        keep = np.frombuffer(self._counts, dtype=np.int32) > 0
        end = at + int(np.count_nonzero(keep))
        gaps[at:end] = np.frombuffer(self._gaps, dtype=np.float64)[keep]
        return end

    def copy_counts(self, counts: np.ndarray, at: int) -> int:
        """Write the kept entries' counts into ``counts`` from ``at``; return where they end."""
        weights = np.frombuffer(self._counts, dtype=np.int32)
        kept = weights[weights > 0]
        counts[at : at + len(kept)] = kept
        return at + len(kept)

    def release_times(self) -> None:
        """Nothing to give back before the counts are copied."""


class EventStream:
    """The stream events of one decode group, appended to directly by it (hot path).

    Attributes:
        times: every event's time, in order.
        run_starts, run_counts: the veterans (members that had the previous event too)
            per event, as runs: from event ``run_starts[j]`` on, ``run_counts[j]`` of them
            share the gap since the previous event (before the first run: none).
        gaps, counts: other weighted gaps (members that joined since the previous event).
    """

    def __init__(self) -> None:
        self.times = array("d")
        self.run_starts = array("q")
        self.run_counts = array("i")
        self.gaps = array("d")
        self.counts = array("i")
        self._events = 0  # len(times), kept once the times are given back

    def kept(self) -> int:
        """Rows this stream becomes: events with veterans, and joiners' gaps with a positive count."""
        starts, counts = self._runs()
        lengths = np.diff(starts, append=len(self.times))
        return int(lengths[counts > 0].sum()) + self._joiners().kept()

    def copy_gaps(self, gaps: np.ndarray, at: int) -> int:
        """Per event with veterans the gap since the previous event (the first: since t = 0), then
        the joiners' gaps with a positive count, into ``gaps`` from ``at``; return where they end."""
        times = np.frombuffer(self.times, dtype=np.float64)
        previous = 0.0
        for first, weights in self._veterans_by_slice(len(times)):
            part = times[first : first + len(weights)]
            keep = weights > 0
            end = at + int(np.count_nonzero(keep))
            gaps[at:end] = np.diff(part, prepend=previous)[keep]
            at, previous = end, float(part[-1])
        return self._joiners().copy_gaps(gaps, at)

    def release_times(self) -> None:
        """Give the event times' memory back (the counts need only the runs)."""
        self._events = len(self.times)
        del self.times[:]

    def copy_counts(self, counts: np.ndarray, at: int) -> int:
        """The counts of the rows of :meth:`copy_gaps`, in the same order; the stream is emptied."""
        for _, weights in self._veterans_by_slice(self._events):
            kept = weights[weights > 0]
            counts[at : at + len(kept)] = kept
            at += len(kept)
        at = self._joiners().copy_counts(counts, at)
        for buffer in (self.times, self.run_starts, self.run_counts, self.gaps, self.counts):
            del buffer[:]
        return at

    def _veterans_by_slice(self, events: int) -> Iterator[tuple[int, np.ndarray]]:
        """(first event, veterans of each event) for consecutive slices of the ``events`` events."""
        starts, run_counts = self._runs()
        ends = np.append(starts[1:], events)  # the runs tile the events from starts[0] on
        for first in range(0, events, _EVENTS_PER_SLICE):
            last = min(events, first + _EVENTS_PER_SLICE)
            lo, hi = int(np.searchsorted(ends, first, side="right")), int(np.searchsorted(starts, last))
            weights = np.zeros(last - first, dtype=np.int32)
            if lo < hi:  # the runs overlapping the slice, clipped to it
                begin = max(int(starts[lo]), first)
                lengths = np.minimum(ends[lo:hi], last) - np.maximum(starts[lo:hi], first)
                weights[begin - first :] = np.repeat(run_counts[lo:hi], lengths)
            yield first, weights

    def _joiners(self) -> _WeightedGaps:
        return _WeightedGaps(self.gaps, self.counts)

    def _runs(self) -> tuple[np.ndarray, np.ndarray]:
        return np.frombuffer(self.run_starts, dtype=np.int64), np.frombuffer(self.run_counts, dtype=np.int32)


def empty_itl_frame() -> pd.DataFrame:
    """An ITL table without rows (a run that streamed no second token)."""
    return pd.DataFrame({"gap_s": np.zeros(0), "count": np.zeros(0, dtype=np.int64)})


def itl_stats(gaps: np.ndarray | pd.Series, counts: np.ndarray | pd.Series) -> dict[str, float]:
    """Mean and percentiles of the gaps, each weighted by its count.

    Equal to ``np.mean`` (up to summation rounding) and, exactly, to
    ``np.percentile(np.repeat(gaps, counts), q)`` for q in 50, 90, 99. NaN when no
    gap has a positive count.

    Returns:
        ``itl_mean_s``, ``itl_p50_s``, ``itl_p90_s``, ``itl_p99_s``.
    """
    values = np.asarray(gaps, dtype=np.float64)
    weights = np.asarray(counts, dtype=np.int64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    keys = ["itl_mean_s"] + [f"itl_p{q}_s" for q in ITL_PERCENTILES]
    if not values.size:
        return dict.fromkeys(keys, float("nan"))
    order = np.argsort(values, kind="stable")
    values, ends = values[order], np.cumsum(weights[order])
    stats = [weighted_sum(values, weights[order]) / float(ends[-1])]
    stats += [weighted_percentile(values, ends, q) for q in ITL_PERCENTILES]
    return dict(zip(keys, stats, strict=True))


def weighted_sum(values: np.ndarray, weights: np.ndarray) -> float:
    """The sum of ``values * weights``, the same float in every process.

    Not ``np.dot``: OpenBLAS splits a long dot product across its threads and adds the partial
    sums, so the last bit follows the thread count, which differs between this process, a pool
    worker and a Ray worker (started with ``OMP_NUM_THREADS=1``). numpy's own sum of the
    products (pairwise, over one contiguous float64 array) depends only on the values and their
    order.
    """
    products = np.multiply(values, weights, dtype=np.float64)
    return float(np.add.reduce(products))


def weighted_percentile(sorted_values: np.ndarray, cum_counts: np.ndarray, q: float) -> float:
    """numpy's linear-interpolation percentile of the expanded multiset, without expanding.

    Args:
        sorted_values: distinct or repeated values, ascending.
        cum_counts: running total of their counts (positive), same length.
        q: percentile in [0, 100].

    The same floating-point steps as ``np.percentile(..., method="linear")``: virtual
    index h = (n - 1) x q / 100, neighbours at floor(h) and floor(h) + 1, and numpy's
    two-sided lerp, so the result is bit-identical.
    """
    n = int(cum_counts[-1])
    h = (n - 1) * float(np.true_divide(q, 100))
    if h >= n - 1:
        return float(sorted_values[-1])
    lo = int(np.floor(h))
    gamma = h - lo
    a, b = (float(v) for v in sorted_values[np.searchsorted(cum_counts, [lo, lo + 1], side="right")])
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma
