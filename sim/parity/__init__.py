"""Step-by-step parity with vLLM's own V1 scheduler (issue 28).

One request stream goes through vLLM's real ``Scheduler`` (driven on the CPU with fake
model outputs, as vLLM's own unit tests drive it) and through batchsim's matching preset
(its policy and :class:`~sim.serving.state.ReplicaState`, step by step, no SimPy). Each
side's schedule is a list of steps (:mod:`sim.parity.trace`); :mod:`sim.parity.diff`
finds the first step where they differ, the per-step agreement rates and the TTFT/TPOT
difference when both schedules are priced by batchsim's cost model.

* :mod:`sim.parity.trace`: the recorded-schedule file format (JSON), read and written here.
* :mod:`sim.parity.replay`: batchsim's side (no vLLM needed; CI diffs it against golden files).
* :mod:`sim.parity.vllm_driver`: vLLM's side; imports vLLM lazily (``pip install batchsim[parity]``).
* :mod:`sim.parity.diff`, :mod:`sim.parity.report`: the comparison and ``results/parity/<version>.md``.
"""
