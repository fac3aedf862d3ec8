"""Execution backends: where sweep tasks run.

Both backends have one method, ``imap_unordered(fn, items)``, which yields ``fn(item)``
as each finishes (not in submission order), so results can be saved while the rest
still run. ``fn`` must be picklable (a module-level function or a ``functools.partial``
of one) and so must the items; tasks are plain data (:mod:`sim.sweeps.tasks`).

* ``local``: a process pool of ``workers`` processes (``None``/0: every core); with one
  worker the tasks run in this process, with no pool at all.
* ``ray``: a local Ray with ``workers`` CPUs, or an existing cluster at ``address``
  (``"auto"`` joins the one this machine belongs to); in :mod:`sim.sweeps.ray_backend`,
  the only module that imports Ray.

Pool workers never outlive the process that started them, even one killed with
SIGKILL (:func:`exit_with_parent`).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, TypeVar

from sim.errors import UserError, did_you_mean
from sim.sweeps.errors import WorkerDied  # defined apart so ray_backend need not import this module

T = TypeVar("T")
R = TypeVar("R")

BACKENDS = ("local", "ray")
"""Names accepted by ``backend=`` / ``--backend``."""


class Startup(Protocol):
    """What a backend paid to get its workers (:class:`sim.sweeps.ray_backend.RayStartup`)."""

    @property
    def seconds(self) -> float:
        """Wall time of the start-up (about 0 when a running Ray was reused)."""
        ...

    def line(self) -> str:
        """One line for the progress output."""
        ...

    def metadata(self) -> dict[str, Any]:
        """A JSON-able record of it, kept with the results."""
        ...


class Backend(Protocol):
    """Runs picklable functions on picklable items, yielding results as they finish."""

    @property
    def startup(self) -> Startup | None:
        """What getting the workers cost, once entered; None where not measured (the local pool)."""
        ...

    def imap_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """Yield ``fn(item)`` for every item, in completion order."""
        ...

    def close(self) -> None:
        """Release processes or connections (idempotent); ``__exit__`` calls it too."""
        ...

    def __enter__(self) -> Backend: ...

    def __exit__(self, *exc: Any) -> None: ...


def resolve_workers(workers: int | None) -> int:
    """``None`` or 0 -> every core; otherwise the given count (>= 1)."""
    if workers is None or workers == 0:
        return os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise UserError(
            f"workers = {workers!r}: give a count >= 1, or 0 for every core", field="workers"
        )
    return workers


@dataclass(frozen=True)
class WorkerCount:
    """How many workers a sweep or search starts, and why fewer than asked for.

    Attributes:
        requested: the ``workers`` given (0 or None: every core).
        used: what the backend gets: at most the tasks that can run at once and this
            machine's CPUs (a worker beyond either would only wait, or compete for a core).
        tasks: the most tasks that can run at once.
        cpus: ``os.cpu_count()``.
    """

    requested: int | None
    used: int
    tasks: int
    cpus: int

    @classmethod
    def for_tasks(cls, requested: int | None, tasks: int, *, cluster: bool = False) -> WorkerCount:
        """Cap ``requested`` (checked as :func:`resolve_workers` does) at ``tasks`` and the CPUs.

        ``cluster``: the workers are a Ray cluster's, not started here, so nothing is capped.
        """
        wanted, cpus = resolve_workers(requested), os.cpu_count() or 1
        used = wanted if cluster else max(1, min(wanted, tasks, cpus))
        return cls(requested, used, tasks, cpus)

    def note(self) -> str:
        """One line when an explicit count was cut down; "" otherwise (0 means "every core" anyway)."""
        if not self.requested or self.used >= self.requested or not self.tasks:
            return ""  # 0: every core was asked for; no tasks: a fully resumed sweep starts none
        limits = [f"{self.tasks} task{'s' if self.tasks != 1 else ''} at a time"] if self.used == self.tasks else []
        limits += [f"{self.cpus} CPU{'s' if self.cpus != 1 else ''}"] if self.used == self.cpus else []
        return f"workers: {self.requested} requested, {self.used} used (capped at {' and '.join(limits)})"

    def metadata(self) -> dict[str, Any]:
        """A JSON-able record for ``sweep.json``."""
        record: dict[str, Any] = {"requested": self.requested or 0, "used": self.used}
        return record | ({"note": self.note()} if self.note() else {})


def open_capped_backend(name: str, workers: int | None, address: str | None, tasks: int) -> tuple[Backend, WorkerCount]:
    """:func:`open_backend` with ``workers`` capped by :meth:`WorkerCount.for_tasks` (``--workers 1000``
    for two tasks starts two processes, not 1000), and the count it got."""
    count = WorkerCount.for_tasks(workers, tasks, cluster=name == "ray" and address is not None)
    return open_backend(name, count.used, address), count


def open_backend(name: str, workers: int | None = 1, address: str | None = None) -> Backend:
    """The backend called ``name``; use it as a context manager so its processes are released.

    Raises:
        UserError: unknown backend, bad worker count, ``address`` without Ray, or Ray missing.
    """
    if name not in BACKENDS:
        raise UserError(
            f"backend = '{name}': unknown{did_you_mean(name, BACKENDS)}; "
            f"allowed: {', '.join(BACKENDS)}",
            field="backend",
        )
    count = resolve_workers(workers)
    if name == "ray":
        from sim.sweeps.ray_backend import RayBackend

        return RayBackend(count, address)
    if address is not None:
        raise UserError(
            f"address = '{address}' is only used by the ray backend (--backend ray)",
            field="address",
        )
    return LocalBackend(count)


# --------------------------------------------------------------------------- local
def _init_worker(owner_pid: int) -> None:
    """Pool worker initializer: signals as a worker needs them, and die with the parent."""
    # Ctrl-C reaches the whole process group; only the parent should handle it, and it
    # stops the workers itself, so they do not each print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the CLI's SIGTERM handler (which raises in the parent);
    # the parent's terminate() must simply end a worker.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    exit_with_parent(owner_pid)


def exit_with_parent(owner_pid: int) -> None:
    """End this process as soon as its parent, ``owner_pid``, dies, however it died.

    A pool worker whose parent was killed by SIGKILL (or the OOM killer) would otherwise
    be reparented to pid 1 and wait on its task queue forever. On Linux the kernel
    delivers SIGKILL on parent death (``prctl(PR_SET_PDEATHSIG)``): immediate, and it acts
    even while a long simulation holds the GIL. Elsewhere a daemon thread polls
    ``os.getppid()`` every ``_WATCH_INTERVAL_S``. Both need the owner to be the parent,
    hence no ``forkserver`` (:func:`_pool_context`). The kernel signal fires when the
    parent *thread* that started the worker exits; that is the thread running the sweep,
    which outlives its pool.
    """
    if os.getppid() != owner_pid:
        os._exit(1)  # the owner died before we got here: we were already reparented
    if not _set_parent_death_signal():
        threading.Thread(target=_watch_parent, args=(owner_pid,), daemon=True).start()
    elif os.getppid() != owner_pid:
        os._exit(1)  # it died between the check and prctl(): no signal will come


_WATCH_INTERVAL_S = 0.5
"""How often a worker without ``PR_SET_PDEATHSIG`` checks that its parent is alive."""

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _set_parent_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent exits; False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc symbol (musl variants, sandboxes)
        return False


def _watch_parent(owner_pid: int) -> None:
    while os.getppid() == owner_pid:
        time.sleep(_WATCH_INTERVAL_S)
    os._exit(1)


def _preload() -> None:
    # Imported while the parent is still validating and submitting, not inside the first task.
    import sim.runner  # noqa: F401


def _pool_context() -> multiprocessing.context.BaseContext:
    """fork where it is safe (Linux, no other thread yet), else spawn.

    A forked worker starts with the engine already imported, which matters when one
    simulation takes well under a second; a fresh interpreter needs ~1 s to import it.
    Forking a process that already runs threads (a tqdm monitor, a notebook kernel,
    Ray) can deadlock the child, so then workers start from a clean interpreter.
    Not ``forkserver``: its workers are the fork server's children, and the fork server
    outlives a killed owner as long as any worker holds its liveness pipe (each does),
    so no worker could tell that the sweep is gone (see :func:`exit_with_parent`).
    """
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


class LocalBackend:
    """A process pool on this machine (or, with one worker, plain calls in this process).

    Args:
        workers: number of processes.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self.startup: Startup | None = None  # not measured: workers start in the background

    def __enter__(self) -> LocalBackend:
        if self.workers > 1:
            try:
                self._ensure_pool()  # start workers now, before a progress bar adds a thread
            except BaseException:  # Ctrl-C / SIGTERM while starting: __exit__ will not run
                self.close(terminate=True)
                raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(terminate=exc_type is not None)

    def imap_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """Yield ``fn(item)`` per item as each finishes.

        Raises:
            WorkerDied: a worker process died; results already yielded stay valid.
        """
        if self.workers == 1:
            yield from map(fn, items)
            return
        pool = self._ensure_pool()
        pending: set[Future[R]] = {pool.submit(fn, item) for item in items}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        except BrokenProcessPool:
            raise WorkerDied(
                "a worker process died mid-task (killed or out of memory) or could not start "
                "(a script calling sweep without `if __name__ == '__main__':`); results that "
                "finished are kept — rerun with --resume to complete the rest"
            ) from None
        finally:
            for future in pending:
                future.cancel()

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=_pool_context(), initializer=_init_worker, initargs=(os.getpid(),)
            )
            for _ in range(self.workers):
                self._pool.submit(_preload)
        return self._pool

    def close(self, terminate: bool = False) -> None:
        """Shut the pool down; ``terminate`` kills running tasks (after Ctrl-C or an error)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if terminate:
            # No public API stops running tasks before Python 3.14; without this an
            # interrupted sweep would wait for every in-flight simulation to end.
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
