"""Errors shared by the sweep backends.

In a module of its own so that :mod:`sim.sweeps.backends` (which opens the ray backend)
and :mod:`sim.sweeps.ray_backend` (which raises :class:`WorkerDied` too) both import it,
and neither imports the other back.
"""

from __future__ import annotations

from sim.errors import UserError


class WorkerDied(UserError):
    """A worker process vanished mid-task (killed, out of memory); finished results are kept."""
