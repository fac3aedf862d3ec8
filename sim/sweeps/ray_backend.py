"""The ``ray`` backend: sweep tasks as Ray remote functions, on a local Ray or a cluster.

Joining a cluster is bounded in time. ``ray.init(address=...)`` retries an address that
does not answer for minutes, so before anything else (before the sweep writes its output
folder) the address is checked to accept a TCP connection within
:data:`RAY_CONNECT_TIMEOUT_S`; then ``ray.init`` itself runs in a daemon thread and is
given up after :data:`RAY_INIT_TIMEOUT_S` (a port that accepts connections but is not a
Ray GCS, such as the dashboard's). Either failure is one :class:`UserError` naming the
address. Ray is imported only in this module.

Getting a Ray is timed (:class:`RayStartup`): ``ray.init`` plus waiting for one warm
worker per CPU, which on a fresh local Ray is the seconds-long fixed cost of a sweep.
It is paid once per process: the Ray a sweep starts (or the cluster it joins) is left
running, and the next sweep with the same settings reuses it at no cost; joining a
running cluster (``--address``) pays no local start-up at all.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sim.errors import UserError
from sim.sweeps.errors import WorkerDied

T = TypeVar("T")
R = TypeVar("R")

RAY_CONNECT_TIMEOUT_S = 15.0
"""Seconds a cluster address has to accept a TCP connection before the sweep gives up."""

RAY_INIT_TIMEOUT_S = 60.0
"""Seconds ``ray.init`` may take to join a reachable cluster (it uploads the ``sim`` package)."""

RAY_CLIENT_PORT = 10001  # Ray Client's default, for ray://HOST without a port

clock: Callable[[], float] = time.perf_counter
"""What getting a Ray is timed with: tests put a fake clock here that their fake Ray advances."""
_START_HINT = "start one with `ray start --head`, or drop --address to run a local Ray"


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


STARTED, JOINED, REUSED = "started", "joined", "reused"
"""How a backend got its Ray: a new local Ray, a running cluster joined, or a Ray already up in this process."""


@dataclass(frozen=True)
class RayStartup:
    """What getting a Ray cost one backend: how it got it and the seconds that took.

    Attributes:
        how: :data:`STARTED`, :data:`JOINED` or :data:`REUSED`.
        seconds: wall time until the workers were ready: ``ray.init`` plus one warm worker
            per CPU (about 0 when reused).
        where: the Ray in words, for the progress line.
        init_s: the part of ``seconds`` spent in ``ray.init``.
    """

    how: str
    seconds: float
    where: str
    init_s: float = 0.0

    def line(self) -> str:
        """One progress line, e.g. ``ray: started a local Ray (2 CPUs) in 9.1 s (ray.init 5.0 s, ...)``."""
        if self.how == REUSED:
            return f"ray: reusing {self.where} (no start-up, {self.seconds:.2f} s)"
        parts = f"ray.init {self.init_s:.1f} s, workers {self.seconds - self.init_s:.1f} s"
        return f"ray: {self.how} {self.where} in {self.seconds:.1f} s ({parts})"

    def metadata(self) -> dict[str, Any]:
        """The JSON-able record kept with the results (``sweep.json``, ``table.attrs``)."""
        return {
            "backend": "ray", "ray_start": self.how, "ray_startup_s": round(self.seconds, 3),
            "ray_init_s": round(self.init_s, 3),
        }  # fmt: skip


@dataclass(frozen=True)
class _OwnRay:
    """The Ray this module started or joined and left running for the next sweep in this process."""

    key: tuple[str | None, int | None]  # (address, None) for a cluster, (None, CPUs) for a local Ray
    job_id: str  # tells it apart from a Ray someone initialized after ours was shut down


_own: _OwnRay | None = None


class RayBackend:
    """Tasks as Ray remote functions, on a local Ray or an existing cluster.

    The ``sim`` package is shipped to the workers (Ray ``py_modules``), so every node
    runs exactly this code and a cluster needs no batchsim install.

    Starting a local Ray costs seconds, so it is paid once per process: the Ray a
    backend starts (or the cluster it joins) stays up after the sweep, and the next
    sweep in the same process with the same address (or, locally, the same CPU count)
    reuses it; a different one replaces it. Ray stops it when the process exits
    (:func:`shutdown_ray` stops it sooner). A Ray initialized in this process by someone
    else (a notebook's ``ray.init()``) is used as it is and never stopped. What getting
    the Ray cost is :attr:`startup`.

    Args:
        workers: CPUs of the local Ray started when ``address`` is None.
        address: cluster address (``"auto"``, ``"HOST:PORT"``, ``"ray://host:10001"``), or None.

    Raises:
        UserError: Ray is not installed, or ``address`` is malformed, does not accept a
            connection within :data:`RAY_CONNECT_TIMEOUT_S` or is not joined within
            :data:`RAY_INIT_TIMEOUT_S` (a cluster is joined here, at once).
    """

    def __init__(self, workers: int, address: str | None = None) -> None:
        self.workers = workers
        self.address = address
        self._ray = _import_ray()
        self._remote: Any = None
        self.startup: RayStartup | None = None
        """How this backend got its Ray and how long it took; None until it has one."""
        if address is not None and not self._reusable():
            # Join now, not with the first tasks: a wrong or silent address must fail
            # before the sweep writes anything. Joining takes about a second.
            check_reachable(address)
            self._connect()

    def __enter__(self) -> RayBackend:
        # Entered only when there is work (a fully resumed sweep never pays for a Ray),
        # and before the progress bar, so the bar can say what the start-up cost.
        self._connect()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: the Ray stays up for the next sweep in this process (see the class)."""

    @property
    def _key(self) -> tuple[str | None, int | None]:
        return (self.address, None) if self.address is not None else (None, self.workers)

    def _reusable(self) -> bool:
        """A Ray is up in this process and is either not ours (used as is) or ours for this key."""
        if not self._ray.is_initialized():
            return False
        own = _own_ray(self._ray)
        return own is None or own.key == self._key

    def _connect(self) -> None:
        """Get a Ray (reuse, join or start one) and time it; idempotent."""
        if self._remote is not None:
            return
        ray = self._ray
        began = clock()
        how = REUSED if self._reusable() else self._start()
        init_s = clock() - began
        if how != REUSED:
            _warm_up(ray, self.workers)
        # Ray retries a task whose worker died; the result is the same, so that is safe.
        self._remote = ray.remote(num_cpus=1, max_retries=2)(_apply)
        self.startup = RayStartup(how, clock() - began, self._where(how), init_s)

    def _start(self) -> str:
        """Start a local Ray or join ``address``, replacing a Ray of ours kept for other settings."""
        global _own
        ray = self._ray
        if ray.is_initialized():  # ours (else it would be reusable), for another address or CPU count
            ray.shutdown()
        runtime_env = {"py_modules": [str(Path(__file__).resolve().parents[1])]}
        quiet: dict[str, Any] = {
            "log_to_driver": False,
            "logging_level": logging.ERROR,
            "runtime_env": runtime_env,
        }
        if self.address is not None:
            self._join(quiet)
        else:
            # "local": a new Ray of our own. Without it ray.init connects to any cluster that
            # `ray start --head` left on this machine, and refuses num_cpus for it.
            _init_keeping_sigterm(ray, address="local", num_cpus=self.workers, include_dashboard=False, **quiet)
        _own = _OwnRay(self._key, _job_id(ray))
        return JOINED if self.address is not None else STARTED

    def _where(self, how: str) -> str:
        if how == REUSED:
            return "the Ray already running in this process"
        if self.address is not None:
            return f"the Ray cluster at {self.address}"
        return f"a local Ray ({self.workers} CPU{'s' if self.workers != 1 else ''})"

    def _join(self, options: dict[str, Any]) -> None:
        """``ray.init(address=...)`` in a daemon thread, given up after ``RAY_INIT_TIMEOUT_S``.

        A thread is the only way to bound it: the wait happens inside Ray's C++ client,
        which a signal cannot interrupt. Off the main thread Ray also leaves the
        caller's SIGTERM handler alone. A thread given up on is abandoned (daemon).
        """
        outcome: dict[str, BaseException | None] = {}

        def attempt() -> None:
            try:
                self._ray.init(address=self.address, **options)
                outcome["error"] = None
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
                outcome["error"] = exc

        thread = threading.Thread(target=attempt, name="ray-init", daemon=True)
        thread.start()
        thread.join(RAY_INIT_TIMEOUT_S)
        if "error" not in outcome:
            reason = f"it accepts connections but Ray did not join within {RAY_INIT_TIMEOUT_S:g} s"
            raise UserError(
                f"address = '{self.address}': cannot reach a Ray cluster ({reason}; is it the GCS port "
                f"of `ray start --head`, or ray://HOST:10001?); {_START_HINT}",
                field="address",
            )
        error = outcome["error"]
        if isinstance(error, (ConnectionError, TimeoutError, ValueError)):
            raise UserError(
                f"address = '{self.address}': cannot reach a Ray cluster ({_one_line(error)}); {_START_HINT}",
                field="address",
            ) from None
        if error is not None:
            raise error

    def imap_unordered(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """Submit every item, then yield results with ``ray.wait`` as they finish."""
        self._connect()
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


def _ready() -> int:
    import sim.runner  # noqa: F401 - what the first real task would import

    return os.getpid()


def _warm_up(ray: Any, count: int) -> None:
    """Run ``count`` no-op tasks that import the engine, so the workers are up before the sweep.

    A fresh Ray starts its worker processes (and unpacks the shipped ``sim`` package)
    only after ``ray.init`` returns: seconds that would otherwise hide in the first
    points. Waiting for them here makes :attr:`RayBackend.startup` the whole fixed cost.
    """
    ray.get([ray.remote(num_cpus=1)(_ready).remote() for _ in range(count)])


def shutdown_ray() -> None:
    """Stop (or leave) the Ray that a ray backend started (or joined) in this process.

    A Ray initialized by someone else is left running. Sweeps keep theirs up so that the
    next sweep in the process need not start one again; this releases it sooner than the
    process's exit does (tests, a long-lived notebook that is done with Ray).
    """
    global _own
    if _own is None:
        return
    ray = _import_ray()
    if _own_ray(ray) is not None:
        ray.shutdown()
    _own = None


def _own_ray(ray: Any) -> _OwnRay | None:
    """The Ray we left running, if it is the one initialized in this process now."""
    if _own is None or not ray.is_initialized():
        return None
    return _own if _job_id(ray) == _own.job_id else None


def _job_id(ray: Any) -> str:
    """The job of this driver's Ray connection: a new one for every ``ray.init``."""
    try:
        return str(ray.get_runtime_context().get_job_id())
    except Exception:  # noqa: BLE001 - an old or a client-mode Ray: assume the same connection
        return ""


def _init_keeping_sigterm(ray: Any, **options: Any) -> None:
    """``ray.init`` in this thread, then put back the SIGTERM handler it replaces.

    On the main thread ``ray.init`` installs a handler that calls ``sys.exit``; the CLI's
    own handler turns SIGTERM into the same clean shutdown as Ctrl-C, so it must stay.
    """
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if on_main else None
    try:
        ray.init(**options)
    finally:
        if on_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- reachability
def check_reachable(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`UserError` unless ``address`` accepts a TCP connection within ``timeout_s``.

    ``"local"`` (start a new local Ray) is not checked; ``"auto"`` is resolved as Ray
    resolves it (``RAY_ADDRESS``, then the cluster this machine last started).
    """
    target = _resolve_auto() if address == "auto" else address
    if target is None or target == "local":
        return  # nothing to connect to, or a Ray that resolves "auto" its own way
    host, port = _endpoint(target)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        timed_out = isinstance(exc, TimeoutError)
        reason = f"no answer within {timeout_s:g} s" if timed_out else (exc.strerror or str(exc)).lower()
        resolved = f" (that is {target})" if target != address else ""
        raise UserError(
            f"address = '{address}'{resolved}: cannot reach a Ray cluster ({reason}); {_START_HINT}",
            field="address",
        ) from None


def _endpoint(address: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``ray://HOST[:PORT]`` -> (host, port)."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = None
    if port is None and parts.scheme == "ray":
        port = RAY_CLIENT_PORT
    if not parts.hostname or port is None:
        raise UserError(
            f"address = '{address}': expected HOST:PORT (a Ray GCS, e.g. 10.0.0.5:6379), "
            "ray://HOST[:PORT] (Ray Client) or 'auto'",
            field="address",
        )
    return parts.hostname, port


def _resolve_auto() -> str | None:
    """The address ``"auto"`` stands for, or None when this Ray version cannot tell us.

    Raises:
        UserError: no running Ray cluster is known on this machine.
    """
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and env != "auto":
        return env
    try:  # private, but the very function ray.init uses; absent in some version: skip
        from ray._private.services import canonicalize_bootstrap_address_or_die as resolve
    except ImportError:
        return None
    try:
        return str(resolve("auto"))
    except ConnectionError as exc:
        raise UserError(
            f"address = 'auto': cannot reach a Ray cluster ({_one_line(exc)}); {_START_HINT}",
            field="address",
        ) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
