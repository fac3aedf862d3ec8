"""One replayable piece of real data: a burst run, a load stage or a per-request trace.

Each shape of validation data (:mod:`sim.validation.folder` finds them) yields
:class:`Case` objects. A case knows its measured server (:class:`ServerFlags`), builds the
replay scenario (:meth:`Case.scenario_dict`: the server's preset and flags, the shape's
workload and front end) and compares the replay's request records with what was measured
(:meth:`Case.compare`), one :class:`Residual` per metric.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.errors import UserError, shown
from sim.validation.server import ServerFlags, catalog_names, memory_block, policy_entry, preset_for

POLICY_NAME = "replay"
"""Name of the one policy of every replay scenario."""
SATURATED = 0.9
"""load_frac from which a case is marked saturated: small cost errors become large latency errors."""


@dataclass(frozen=True)
class Residual:
    """Measured vs simulated for one metric.

    Per-request comparisons (metric names with ``_req_``) hold the ideal residual 0 as
    ``measured`` and the statistic of the per-request residuals as ``simulated``;
    ``error_pct`` is then NaN. So is it for a measurement below ``floor`` (in its unit), where
    a relative error means nothing (a queue of a few microseconds).
    """

    metric: str
    unit: str
    measured: float
    simulated: float
    floor: float = 0.0

    @property
    def error_pct(self) -> float:
        """100 (simulated - measured) / measured; NaN for per-request rows or a measurement below the floor."""
        if "_req_" in self.metric or not self.measured or abs(self.measured) < self.floor:
            return math.nan
        return 100.0 * (self.simulated - self.measured) / self.measured


@dataclass(frozen=True, kw_only=True)
class Case:
    """A replayable measurement. Subclasses give the workload, the front end and the comparison.

    Attributes:
        shape: ``burst``, ``stages`` or ``trace``.
        name: the run's name in tables (a file stem, ``<file>:stage <k>``, a trace run).
        flags: the measured server.
        n: requests the client sent.
        source: where the measurement comes from (repository, path, commit).
        requested_rps: for a replay as a closed loop, the rate the client tried to send (its
            ``load_frac`` is then requested rate / capacity); None otherwise.
    """

    shape: str
    name: str
    flags: ServerFlags
    n: int
    source: str
    requested_rps: float | None = None

    def workload(self, folder: Path) -> dict[str, Any]:
        """The replay's ``workload`` block; may write a trace file into ``folder`` (which outlives the run)."""
        raise NotImplementedError

    measured_at_engine = False
    """The measurement starts when a request reaches the engine (server spans): no front end is replayed.
    Otherwise the client's measurement includes the API server, replayed as the preset's front end."""

    def compare(self, requests: pd.DataFrame) -> list[Residual]:
        """Measured vs simulated, from the replay's request records (``RunResult.requests`` of its one policy)."""
        raise NotImplementedError

    @property
    def preset(self) -> str:
        """The batchsim preset standing for the measured engine version."""
        return preset_for(self.flags.engine_version)

    def check(self) -> None:
        """Raise UserError now for a server batchsim cannot replay (before any simulation)."""
        catalog_names(self.flags, self.name)
        policy_entry(self.flags, POLICY_NAME, self.name)
        tp, gpus = self.flags.tensor_parallel, self.flags.num_gpus
        if gpus % tp:
            raise UserError(f"run {shown(self.name)}: num_gpus = {gpus} is not a multiple of tensor_parallel = {tp}")

    def notes(self) -> tuple[str, ...]:
        """Flags of the measured server that the replay cannot express."""
        return policy_entry(self.flags, POLICY_NAME, self.name)[1]

    def scenario_dict(self, folder: Path) -> dict[str, Any]:
        """The replay scenario (as ``sim.Scenario(**d)`` takes it)."""
        self.check()
        model, gpu = catalog_names(self.flags, self.name)
        policy, _ = policy_entry(self.flags, POLICY_NAME, self.name)
        if self.measured_at_engine:
            policy["frontend"] = None  # the preset's server is outside what was measured
        tp = self.flags.tensor_parallel
        scenario: dict[str, Any] = {
            "name": replay_name(self.name), "seed": 0, "model": model, "gpu": gpu,
            "tensor_parallel": tp, "replicas": self.flags.num_gpus // tp, "max_model_len": self.flags.max_model_len,
            # The server's KV settings also at the scenario level, so the KV budget is the server's
            # whether or not the policy's own gpu_memory_utilization is applied.
            "memory": memory_block(self.flags),
            "workload": self.workload(folder),
            "policies": [policy],
        }  # fmt: skip
        return scenario


def replay_name(run_name: str) -> str:
    """A valid scenario ``name`` for a run named after any file: each character a scenario name
    does not allow (a space, a slash, ...) becomes '_', no leading '.', at most 128 characters.

    The scenario name only labels the replay in memory; tables keep the run's own name.
    """
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", run_name).lstrip(".")[:128] or "run"


def completed(requests: pd.DataFrame) -> pd.DataFrame:
    """The completed requests of a replay, in request order."""
    return requests[requests["status"] == "completed"].sort_values("request_id")


def stat_ms(values_s: np.ndarray, stat: str) -> float:
    """``mean`` or ``pQ`` (linear-interpolation percentile) of seconds, in ms; NaN for no values."""
    values = np.asarray(values_s, dtype=np.float64)
    values = values[~np.isnan(values)]
    if not values.size:
        return math.nan
    if stat == "mean":
        return float(values.mean()) * 1e3
    return float(np.percentile(values, float(stat.lstrip("p")))) * 1e3
