"""The fast path of the engine: the common scenarios as plain ints and lists, bit-identical to the general path.

:mod:`~sim.serving.fast.paths` chooses the path and builds the replicas, :mod:`~sim.serving.fast.fleet` drives
them on the SimPy clock, :mod:`~sim.serving.fast.replica` and :mod:`~sim.serving.fast.group` hold their state,
:mod:`~sim.serving.fast.kernels` the policies' decisions and :mod:`~sim.serving.fast.span` the merged decode passes.
"""
