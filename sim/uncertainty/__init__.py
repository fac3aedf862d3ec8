"""How far to trust a run's numbers: intervals on its headline figures and flags where it leaves the evidence.

- :mod:`~sim.uncertainty.sampling`: the sampling error of a figure from one run's requests;
- :mod:`~sim.uncertainty.replicates`: replicate seeds and the spread of a figure over them;
- :mod:`~sim.uncertainty.model_error`: the model-error table built from the validation against real runs;
- :mod:`~sim.uncertainty.intervals`: the three combined into a 90% interval per figure;
- :mod:`~sim.uncertainty.flags`: out-of-range flags (extrapolated step shapes, uncalibrated GPU or model,
  load near capacity);
- :mod:`~sim.uncertainty.trust`: the ``summary.csv`` columns a run appends;
- :mod:`~sim.uncertainty.coverage`: how often the intervals held the measured value of the real runs.

The method is written up in docs/uncertainty.md.
"""
