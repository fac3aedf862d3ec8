"""batchsim: a discrete-event simulator of LLM inference batching.

Public API::

    import sim
    scenario = sim.load_scenario("scenarios/quickstart.yaml")
    result = sim.run(scenario)                      # RunResult: .summary, .requests, .iterations, .save(dir)
    faster = scenario.replace(**{"workload.arrival.rate": 4.0})
    table = sim.sweep(scenario, {"workload.arrival.rate": [1, 2, 4]}, seeds=[0, 1, 2])

Every name loads on first use (the schema needs pydantic, a run pandas and the engine,
sweeps Ray), so ``import sim`` and ``python -m sim --help`` stay cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.errors import UserError
from sim.lazy import lazy_attributes
from sim.version import __version__

__all__ = ["Scenario", "UserError", "load_scenario", "run", "RunResult", "sweep", "capacity", "plots", "__version__"]

__getattr__ = lazy_attributes(
    __name__,
    {
        "Scenario": "sim.config",
        "load_scenario": "sim.io.scenario",
        "run": "sim.runner",
        "RunResult": "sim.runner",
        "sweep": "sim.sweeps.runner",
        "capacity": "sim.sweeps.slo_capacity",
        "plots": "sim.report",
    },
)

if TYPE_CHECKING:
    from sim.config import Scenario
    from sim.io.scenario import load_scenario
    from sim.report import plots
    from sim.runner import RunResult, run
    from sim.sweeps.runner import sweep
    from sim.sweeps.slo_capacity import capacity
