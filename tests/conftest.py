"""Test-wide settings.

Hypothesis's per-example deadline (200 ms) measures wall time, which on a shared two-core CI
machine includes other processes and one-off costs such as the lazy scipy import of the first
example: a property that holds would fail at random. Properties here are judged on what they
assert, so no deadline.
"""

import os

from hypothesis import settings

settings.register_profile("batchsim", deadline=None)
# A longer run of every property and fuzz test (tests/test_fuzz_scenarios.py keeps a smaller fixed
# budget under the default profile): HYPOTHESIS_PROFILE=batchsim-deep python -m pytest ...
settings.register_profile("batchsim-deep", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "batchsim"))
