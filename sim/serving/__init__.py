"""The serving engine: SimPy GPU workers, KV block allocation, routing and clients.

Entry point: :func:`sim.serving.engine.simulate`. The engine owns time, memory and
bookkeeping; the batching decisions come from :mod:`sim.policies`.
"""

from sim.serving.engine import SimOutput, simulate

__all__ = ["SimOutput", "simulate"]
