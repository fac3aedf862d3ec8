"""What both sweep command modules need: option parsing and SIGTERM-as-Ctrl-C.

:mod:`sim.sweeps.cli` (``sweep``, ``capacity``) and :mod:`sim.sweeps.split_cli`
(``capacity --split-gpus``) import these from here; ``cli`` calls into ``split_cli`` and
never the other way round, so the dependency goes one way.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sim.errors import UserError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so it unwinds exactly like Ctrl-C.

    A KeyboardInterrupt subclass: every ``except KeyboardInterrupt`` / ``finally`` on the
    way (pool termination, closing ``sweep.csv``) already does the right thing for it.
    """


@dataclass
class StopSignal:
    """What :func:`sigterm_as_interrupt` saw: whether SIGTERM arrived."""

    terminated: bool = False

    def exit_code(self, stop: KeyboardInterrupt) -> int:
        """143 after SIGTERM, 130 after Ctrl-C.

        Ray turns any exception raised by a signal handler during ``ray.wait`` into a
        plain KeyboardInterrupt, hence the flag next to the exception type.
        """
        return EXIT_TERMINATED if self.was_terminated(stop) else EXIT_INTERRUPTED

    def was_terminated(self, stop: KeyboardInterrupt) -> bool:
        """SIGTERM, not Ctrl-C, stopped the command."""
        return self.terminated or isinstance(stop, Terminated)


@contextmanager
def sigterm_as_interrupt() -> Iterator[StopSignal]:
    """While inside, SIGTERM raises :class:`Terminated`; the previous handler comes back after.

    Python's default for SIGTERM is to die at once: no ``finally`` runs, so a pool's
    workers were orphaned. Only the first SIGTERM raises; later ones are ignored so they
    cannot cut the shutdown short (SIGKILL still can, and workers die with us then too).
    """
    seen = StopSignal()
    if threading.current_thread() is not threading.main_thread():
        yield seen  # signal handlers can only be set from the main thread
        return

    def raise_terminated(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        seen.terminated = True
        raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGTERM, previous)


def parse_slo_options(items: list[str]) -> dict[str, float]:
    """``["ttft_p99_s=2", "tpot_p99_s=0.1"]`` -> ``{"ttft_p99_s": 2.0, "tpot_p99_s": 0.1}``."""
    bounds: dict[str, float] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise UserError(f"--slo expects BOUND=SECONDS, e.g. ttft_p99_s=2; got '{item}'")
        try:
            bounds[key.strip()] = float(text)
        except ValueError:
            raise UserError(f"--slo {key.strip()}: '{text}' is not a number of seconds") from None
    return bounds
