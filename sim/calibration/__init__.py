"""The offline calibration pipeline: Vidur's profile CSVs in, the YAML files of ``sim/hardware/calibrations/`` out.

:mod:`~sim.calibration.profiles` reads the profiles, :mod:`~sim.calibration.fitting` and
:mod:`~sim.calibration.roofline_fit` fit each cost component, :mod:`~sim.calibration.holdout`
measures held-out errors, :mod:`~sim.calibration.calibrate` (A100) and
:mod:`~sim.calibration.gpu_calibrate` / :mod:`~sim.calibration.gpu_roofline` (H100, A40)
assemble the files, :mod:`~sim.calibration.fit_report` draws the fit reports and
:mod:`~sim.calibration.calibrate_cli` is ``python -m sim calibrate``. A run never imports
this package: it reads the files through :mod:`sim.hardware`.
"""
