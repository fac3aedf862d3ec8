"""batchsim: a discrete-event simulator of LLM inference batching.

Public API::

    import sim
    scenario = sim.load_scenario("scenarios/quickstart.yaml")
    result = sim.run(scenario)                      # RunResult: .summary, .requests, .iterations, .save(dir)
    faster = scenario.replace(**{"workload.arrival.rate": 4.0})
    table = sim.sweep(scenario, {"workload.arrival.rate": [1, 2, 4]}, seeds=[0, 1, 2])

Heavy modules (the engine, pandas-based reports, Ray) load on first use, so ``import sim``
stays cheap for tools that only validate scenarios.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.config import Scenario
from sim.errors import UserError
from sim.scenario_io import load_scenario

__version__ = "0.1.0"

__all__ = ["Scenario", "UserError", "load_scenario", "run", "RunResult", "sweep", "capacity", "plots", "__version__"]

_LAZY = {
    "run": ("sim.runner", "run"),
    "RunResult": ("sim.runner", "RunResult"),
    "sweep": ("sim.sweeps", "sweep"),
    "capacity": ("sim.sweeps", "capacity"),
    "plots": ("sim.report", "plots"),
}

if TYPE_CHECKING:
    from sim.runner import RunResult, run


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    import importlib

    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = getattr(module, attr) if attr != "plots" else importlib.import_module("sim.report.plots")
    globals()[name] = value
    return value
