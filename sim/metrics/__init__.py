"""Measurements: columnar record buffers the engine fills (:mod:`sim.metrics.records`)
and pure summary functions over the resulting DataFrames (:mod:`sim.metrics.summary`)."""
