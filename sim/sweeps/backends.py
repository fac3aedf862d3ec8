"""Execution backends: where sweep tasks run.

Both backends have one method, ``imap_unordered(fn, items)``, which yields ``fn(item)``
as each finishes (not in submission order), so results can be saved while the rest
still run. ``fn`` must be picklable (a module-level function or a ``functools.partial``
of one) and so must the items; tasks are plain data (:mod:`sim.sweeps.tasks`).

* ``local``: a process pool of ``workers`` processes (``None``/0: every core); with one
  worker the tasks run in this process, with no pool at all.
* ``ray``: a local Ray with ``workers`` CPUs, or an existing cluster at ``address``
  (``"auto"`` joins the one this machine belongs to). Ray is imported only here.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

from sim.errors import UserError, did_you_mean

T = TypeVar("T")
R = TypeVar("R")

BACKENDS = ("local", "ray")
"""Names accepted by ``backend=`` / ``--backend``."""


class WorkerDied(UserError):
    """A worker process vanished mid-task (killed, out of memory); finished results are kept."""


class Backend(Protocol):
    """Runs picklable functions on picklable items, yielding results as they finish."""

    def imap_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """Yield ``fn(item)`` for every item, in completion order."""
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
        return RayBackend(count, address)
    if address is not None:
        raise UserError(
            f"address = '{address}' is only used by the ray backend (--backend ray)",
            field="address",
        )
    return LocalBackend(count)


# --------------------------------------------------------------------------- local
def _ignore_sigint() -> None:
    # Ctrl-C reaches the whole process group; only the parent should handle it, and it
    # stops the workers itself, so they do not each print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _preload() -> None:
    # Imported while the parent is still validating and submitting, not inside the first task.
    import sim.runner  # noqa: F401


def _pool_context() -> multiprocessing.context.BaseContext:
    """fork where it is safe (Linux, no other thread yet), else forkserver or spawn.

    A forked worker starts with the engine already imported, which matters when one
    simulation takes well under a second; a fresh interpreter needs ~1 s to import it.
    Forking a process that already runs threads (a tqdm monitor, a notebook kernel,
    Ray) can deadlock the child, so then workers start from a clean interpreter.
    """
    methods = multiprocessing.get_all_start_methods()
    if sys.platform.startswith("linux") and "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class LocalBackend:
    """A process pool on this machine (or, with one worker, plain calls in this process).

    Args:
        workers: number of processes.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> LocalBackend:
        if self.workers > 1:
            self._ensure_pool()  # start workers now, before a progress bar adds a thread
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
                self.workers, mp_context=_pool_context(), initializer=_ignore_sigint
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


# --------------------------------------------------------------------------- ray
def _apply(fn: Callable[[T], R], item: T) -> R:
    return fn(item)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError(
            'the ray backend needs Ray: pip install ".[ray]" (or pip install "ray>=2.9")',
            field="backend",
        ) from None
    return ray


class RayBackend:
    """Tasks as Ray remote functions, on a local Ray or an existing cluster.

    The ``sim`` package is shipped to the workers (Ray ``py_modules``), so every node
    runs exactly this code and a cluster needs no batchsim install. A Ray already
    initialized in this process (a notebook) is used as it is and left running.

    Args:
        workers: CPUs of the local Ray started when ``address`` is None.
        address: cluster address (``"auto"``, ``"ray://host:10001"``, ...), or None.
    """

    def __init__(self, workers: int, address: str | None = None) -> None:
        self.workers = workers
        self.address = address
        self._ray = _import_ray()
        self._started = False
        self._remote: Any = None

    def __enter__(self) -> RayBackend:
        return self  # Ray starts on the first tasks: a fully resumed sweep never pays for it

    def __exit__(self, *exc: Any) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False

    def _start(self) -> None:
        ray = self._ray
        if not ray.is_initialized():
            runtime_env = {"py_modules": [str(Path(__file__).resolve().parents[1])]}
            quiet: dict[str, Any] = {
                "log_to_driver": False,
                "logging_level": logging.ERROR,
                "runtime_env": runtime_env,
            }
            if self.address is not None:
                self._join(quiet)
            else:
                ray.init(num_cpus=self.workers, include_dashboard=False, **quiet)
            self._started = True
        # Ray retries a task whose worker died; the result is the same, so that is safe.
        self._remote = ray.remote(num_cpus=1, max_retries=2)(_apply)

    def _join(self, options: dict[str, Any]) -> None:
        try:
            self._ray.init(address=self.address, **options)
        except ConnectionError as exc:
            raise UserError(
                f"cannot reach a Ray cluster at address '{self.address}': {exc}; start one with "
                "`ray start --head`, or drop --address to run a local Ray",
                field="address",
            ) from None

    def imap_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """Submit every item, then yield results with ``ray.wait`` as they finish."""
        if self._remote is None:
            self._start()
        ray = self._ray
        pending = [self._remote.remote(fn, item) for item in items]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])
        except ray.exceptions.WorkerCrashedError:
            raise WorkerDied(
                "a Ray worker died mid-task (killed or out of memory) and its retries failed; "
                "results that finished are kept — rerun with --resume to complete the rest"
            ) from None
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
