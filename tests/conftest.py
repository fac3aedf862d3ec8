"""Test-wide settings: the Hypothesis profile, chosen by the ``HYPOTHESIS_PROFILE`` variable.

- ``ci`` (the default, what CI and the README's test command run): 100 examples per property
  (a property asks for a share of them with :func:`budget.examples`), the same examples on
  every run (``derandomize``: a red CI means the change, not the draw), no example database.
- ``dev``: a tenth of the examples, freshly drawn each run, failures kept in ``.hypothesis/``
  and replayed first: ``HYPOTHESIS_PROFILE=dev python -m pytest`` for a quick local round.

Both judge properties on what they assert, never on time: Hypothesis's per-example deadline
(200 ms) and its too-slow health check measure wall time, which on a shared two-core CI machine
includes other processes and one-off costs such as the lazy scipy import of the first example,
so a property that holds would fail at random.

"""

import os

from hypothesis import HealthCheck, settings

_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}

settings.register_profile("ci", max_examples=100, derandomize=True, database=None, print_blob=True, **_UNTIMED)
settings.register_profile("dev", max_examples=10, **_UNTIMED)
# A longer run of every property and fuzz test: HYPOTHESIS_PROFILE=deep python -m pytest ...
settings.register_profile("deep", max_examples=1000, **_UNTIMED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
