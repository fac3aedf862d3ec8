"""Test-wide settings.

Hypothesis's per-example deadline (200 ms) measures wall time, which on a shared two-core CI
machine includes other processes and one-off costs such as the lazy scipy import of the first
example: a property that holds would fail at random. Properties here are judged on what they
assert, so no deadline.
"""

from hypothesis import settings

settings.register_profile("batchsim", deadline=None)
settings.load_profile("batchsim")
