"""How many examples a Hypothesis property draws: a share of the active profile's count.

The profile (``HYPOTHESIS_PROFILE``, see ``conftest.py``) sets one count for every property;
a property whose examples are cheap asks for a multiple of it, one whose examples run whole
simulations for a fraction, so that switching the profile scales every property alike.
"""

from hypothesis import settings


def examples(share: float) -> int:
    """``share`` times the active profile's ``max_examples`` (100 under ``ci``), at least one.

    Args:
        share: this property's examples relative to the profile's count.
    """
    return max(1, round(share * settings().max_examples))
