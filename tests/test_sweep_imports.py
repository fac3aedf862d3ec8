"""Every name moved to break the import circles of :mod:`sim.sweeps` is still importable from where it
used to live (tests/test_layout.py checks that the whole package has no circle)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("sim.sweeps.backends", "WorkerDied"),
        ("sim.sweeps.errors", "WorkerDied"),
        ("sim.sweeps.cli", "parse_slo_options"),
        ("sim.sweeps.cli", "sigterm_as_interrupt"),
        ("sim.sweeps.cli", "Terminated"),
        ("sim.sweeps.cli", "StopSignal"),
        ("sim.sweeps.cli", "EXIT_TERMINATED"),
        ("sim.sweeps.cli_common", "sigterm_as_interrupt"),
        ("sim.sweeps.split_cli", "run_split_search"),
    ],
)
def test_moved_names_are_importable_where_they_were(module: str, name: str) -> None:
    import importlib

    assert hasattr(importlib.import_module(module), name)


def test_one_worker_died_class() -> None:
    from sim.sweeps import backends, errors, ray_backend

    assert backends.WorkerDied is errors.WorkerDied is ray_backend.WorkerDied
