"""Start a local Dask cluster or connect to a remote one, and shut either down.

Training runs one DDP rank per Dask worker process, so a local cluster is made of worker
*processes*, tuned for training (:mod:`petmodel.dist.tuning`). Every expected failure (bad
address, unreachable scheduler, something else on the port) is a
:class:`~petmodel.errors.PetmodelError` with one sentence for the user.

Shut down with :func:`shutdown` (or ``client.close()``): a client returned by
:func:`start_local_cluster` owns its cluster and closes it too; a client returned by
:func:`connect` only disconnects and leaves the remote cluster running.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

import dask
from distributed import Client, LocalCluster
from tornado.ioloop import IOLoop

from petmodel.dist.tuning import LOCAL_WORKER_CONFIG, PLUGIN_NAME, TorchThreadsPlugin
from petmodel.dist.workers import _positive_timeout
from petmodel.errors import PetmodelError, UsageError

log = logging.getLogger(__name__)

_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
_ADDRESS = re.compile(
    r"^(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$"
)
_EXPECTED_FORM = "tcp://host:port, host:port, or the path of a scheduler JSON file"


class _EventLoopThread:
    """An event loop on a daemon thread that this module starts and stops itself.

    Handed to ``Client(loop=...)``: a client never stops a running loop it did not create, so
    the loop's lifetime is ours, and we can end it even after a failed start, when
    ``Client.close`` does nothing (the client already counts itself closed) and the client's
    own loop thread would stay behind for the life of the process.
    """

    def __init__(self) -> None:
        ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self.loop: IOLoop | None = None

        async def main() -> None:
            self._aloop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self.loop = IOLoop.current()
            ready.set()
            await self._stop.wait()  # asyncio.run then cancels what is left and closes the loop

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True,
                                        name="petmodel client loop")
        self._thread.start()
        if not ready.wait(10) or self.loop is None:
            raise RuntimeError("The Dask client's event loop did not start.")

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop and its thread; safe to call twice."""
        if self._thread.is_alive() and self._aloop is not None and self._stop is not None:
            with suppress(RuntimeError):  # the loop closed in the meantime
                self._aloop.call_soon_threadsafe(self._stop.set)
            if threading.current_thread() is not self._thread:
                self._thread.join(timeout)


class _PetmodelClient(Client):
    """A ``distributed.Client`` that can own a cluster and cleans up after a failed start.

    Two gaps in ``distributed.Client`` (checked on 2026.8.0) make this worth a subclass:
    ``Client(cluster).close()`` leaves ``cluster`` running, and a ``Client(address)`` whose
    start fails leaves its event-loop thread running (and a server that accepts the TCP
    connection but never answers makes the start hang despite ``timeout=``). With
    ``own_loop=True`` the client runs on an :class:`_EventLoopThread` that :meth:`close`,
    and a failed start, stop.
    """

    def __init__(
        self, *args: Any, start_limit: float | None = None, own_loop: bool = False, **kwargs: Any
    ) -> None:
        # Set before ``Client.__init__``, which calls :meth:`start`.
        self._petmodel_start_limit = start_limit
        self._petmodel_cluster: Any = None
        self._petmodel_loop = _EventLoopThread() if own_loop else None
        if self._petmodel_loop is not None:
            kwargs["loop"] = self._petmodel_loop.loop
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self._stop_own_loop()
            raise

    def start(self, **kwargs: Any) -> None:
        """Start as usual, bounded overall by ``start_limit``; on failure, close what it left."""
        if self._petmodel_start_limit is not None and not self.asynchronous:
            # ``Client.start`` hands its kwargs to ``distributed.utils.sync``, which takes
            # ``callback_timeout`` and cancels the start when it runs out.
            kwargs.setdefault("callback_timeout", self._petmodel_start_limit)
        try:
            super().start(**kwargs)
        except BaseException:
            with suppress(Exception):
                Client.close(self, timeout=2)
            self._stop_own_loop()
            raise

    def _stop_own_loop(self) -> None:
        if self._petmodel_loop is not None:
            self._petmodel_loop.stop()

    def own(self, cluster: Any) -> None:
        """Make :meth:`close` also close ``cluster``."""
        self._petmodel_cluster = cluster

    def close(self, *args: Any, **kwargs: Any) -> Any:
        """Close the client, then the cluster and the event loop it owns (if any)."""
        try:
            return super().close(*args, **kwargs)
        finally:
            cluster, self._petmodel_cluster = self._petmodel_cluster, None
            try:
                if cluster is not None:
                    cluster.close()
            finally:
                self._stop_own_loop()


def _visible_gpu_count() -> int:
    """CUDA devices this process can see (0 without torch or without CUDA)."""
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # a broken driver means "no usable GPU", not a crash
        return 0


def default_local_shape() -> tuple[int, int]:
    """``(n_workers, threads_per_worker)`` that suits this machine.

    With GPUs: one worker (one DDP rank) per GPU, sharing the CPUs. Without: up to four
    single-threaded workers, because DDP over gloo scales best with one thread per rank on
    small CPUs and more ranks than that mostly add all-reduce traffic.
    """
    cpus = os.cpu_count() or 1
    gpus = _visible_gpu_count()
    if gpus:
        return gpus, max(1, cpus // gpus)
    return max(1, min(4, cpus)), 1


MAX_LOCAL_WORKERS_ENV = "PETMODEL_MAX_LOCAL_WORKERS"
RANKS_PER_CORE_LIMIT = 4  # an embedded cluster past this many ranks per core is refused, not just slow


def local_capacity(threads_per_worker: int = 1) -> int:
    """Workers of ``threads_per_worker`` threads this machine's cores hold without sharing them."""
    return max(1, (os.cpu_count() or 1) // max(1, threads_per_worker))


def max_local_workers(threads_per_worker: int = 1) -> int:
    """The most workers an embedded cluster may start here (``$PETMODEL_MAX_LOCAL_WORKERS`` overrides)."""
    text = os.environ.get(MAX_LOCAL_WORKERS_ENV, "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    return RANKS_PER_CORE_LIMIT * local_capacity(threads_per_worker)


def oversubscription_note(n_workers: int, threads_per_worker: int = 1) -> str | None:
    """One sentence when an embedded cluster of this shape would share cores between ranks, else None."""
    cpus, fits = os.cpu_count() or 1, local_capacity(threads_per_worker)
    if _visible_gpu_count() or n_workers <= fits:
        return None
    return (f"{n_workers} workers × {threads_per_worker} thread(s) share this machine's {cpus} cores, so each trains "
            f"slower and timings will not show real scaling; {fits} or fewer fit, or use a cluster.")


def check_local_shape(n_workers: int, threads_per_worker: int = 1) -> None:
    """Refuse, in one sentence, an embedded cluster larger than :func:`max_local_workers` allows."""
    limit = max_local_workers(threads_per_worker)
    if n_workers > limit and not _visible_gpu_count():
        raise UsageError(f"{n_workers} local workers × {threads_per_worker} thread(s) is more than this "
                         f"{os.cpu_count() or 1}-core machine can run ({limit} at most; ${MAX_LOCAL_WORKERS_ENV} "
                         "changes that); ask for fewer, or connect to a cluster.")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a whole number of at least 1, not {value!r}.")
    return value


def _register_torch_threads(client: Client, timeout: float = 30.0) -> None:
    """Register :class:`TorchThreadsPlugin`, bounded by ``timeout``; warn rather than fail.

    Workers that cannot unpickle it (no petmodel there) will also fail to train, but that
    is for training to report; describing the cluster still works. A frozen worker makes the
    scheduler's broadcast wait forever, hence the bound.
    """
    try:
        client.sync(client._register_worker_plugin, TorchThreadsPlugin(), name=PLUGIN_NAME,
                    idempotent=False, callback_timeout=timeout)
    except Exception as err:  # raised on a worker, or timed out; we only lose thread tuning
        warnings.warn(
            f"Could not set torch's thread count on the Dask workers ({err!r}); "
            "is petmodel installed on them?",
            RuntimeWarning,
            stacklevel=3,
        )


def start_local_cluster(
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    *,
    memory_limit: str | int | float | None = "auto",
    dashboard_address: str | None = "127.0.0.1:0",
    config: Mapping[str, Any] | None = None,
) -> Client:
    """Start a cluster of worker *processes* on this machine and return a client owning it.

    Processes rather than threads because each DDP rank needs its own interpreter (and its
    own torch thread pool). With visible GPUs and ``dask_cuda`` installed the cluster is a
    ``LocalCUDACluster``, which pins one GPU per worker via ``CUDA_VISIBLE_DEVICES``.
    Workers start with :data:`~petmodel.dist.tuning.LOCAL_WORKER_CONFIG`, then ``config`` on
    top (e.g. :data:`~petmodel.dist.tuning.TIMING_CLUSTER_CONFIG`); pass settings here rather
    than through an outer ``dask.config.set``, whose values for the same keys the tuning would
    override. Close with :func:`shutdown` or ``client.close()``; both stop the workers.
    """
    default_workers, default_threads = default_local_shape()
    n_workers = _positive_int(
        "n_workers", default_workers if n_workers is None else n_workers
    )
    threads_per_worker = _positive_int(
        "threads_per_worker",
        default_threads if threads_per_worker is None else threads_per_worker,
    )
    check_local_shape(n_workers, threads_per_worker)
    common: dict[str, Any] = dict(
        n_workers=n_workers,
        threads_per_worker=threads_per_worker,
        memory_limit=memory_limit,
        dashboard_address=dashboard_address,
        silence_logs=logging.ERROR,
    )
    cluster_factory: Callable[..., Any] = LocalCluster
    gpus = _visible_gpu_count()
    if gpus:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            warnings.warn(
                f"{gpus} GPU(s) are visible but dask_cuda is not installed, so every "
                "worker sees every GPU; install dask-cuda to pin one GPU per worker.",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            if n_workers > gpus:
                raise UsageError(
                    f"Asked for {n_workers} GPU workers but only {gpus} GPU(s) are "
                    "visible; ask for fewer workers."
                )
            cluster_factory = LocalCUDACluster
    if cluster_factory is LocalCluster:
        common["processes"] = True
    common["host"] = "127.0.0.1"  # the embedded cluster (and its dashboard) is for this machine only
    with dask.config.set({**LOCAL_WORKER_CONFIG, **(config or {})}):
        cluster = cluster_factory(**common)
    try:
        client = _PetmodelClient(cluster)
    except BaseException:
        cluster.close()
        raise
    client.own(cluster)
    _register_torch_threads(client)
    return client


def _normalise_address(text: str) -> str | None:
    """``scheme://host:port`` for a valid address, else ``None``."""
    match = _ADDRESS.match(text)
    if not match:
        return None
    scheme = (match["scheme"] or "tcp").lower()
    port = int(match["port"])
    if scheme not in _SCHEMES or not 1 <= port <= 65535:
        return None
    return f"{scheme}://{match['host']}:{port}"


def _looks_like_path(text: str) -> bool:
    return "://" not in text and (
        text.lower().endswith(".json") or "/" in text or os.sep in text or os.path.isfile(text)
    )


def _address_from_scheduler_file(path: Path) -> str:
    """The scheduler address recorded in a ``--scheduler-file`` JSON file."""
    if not path.is_file():
        raise PetmodelError(
            f"No scheduler file at {path}; check the path, or pass the scheduler's "
            "address as tcp://host:port."
        )
    try:
        address = json.loads(path.read_text(encoding="utf-8"))["address"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PetmodelError(
            f"{path} is not a Dask scheduler file (no readable \"address\" in its JSON); "
            "point to the file the scheduler wrote with --scheduler-file."
        ) from err
    normalised = _normalise_address(str(address))
    if normalised is None:
        raise PetmodelError(
            f"The scheduler file {path} holds an address in an unexpected form "
            f"({address!r}); expected tcp://host:port."
        )
    return normalised


def connect(address: str | os.PathLike[str], *, timeout: float = 10.0, security: Any = None,
            ship: bool = True) -> Client:
    """Connect to a running Dask scheduler and make it ready to train, each step within ``timeout``.

    ``address`` is ``tcp://host:port``, ``tls://host:port``, ``host:port``, or the path of the
    JSON file the scheduler wrote with ``--scheduler-file``; ``security``: a Dask ``Security``
    for ``tls://`` (see :mod:`petmodel.dist.security`). Then: versions are compared on every
    process (:mod:`petmodel.dist.versions`), this client's ``petmodel`` is shipped
    (:mod:`petmodel.dist.shipping`, skipped with ``ship=False``), and workers get their torch
    tuning. A frozen worker makes the connect fail naming it rather than hang. The client does
    not own the cluster: :func:`shutdown` disconnects and leaves it running.
    """
    timeout = _positive_timeout(timeout)
    text = os.fspath(address).strip() if isinstance(address, (str, os.PathLike)) else ""
    if isinstance(address, os.PathLike) or _looks_like_path(text):
        target = _address_from_scheduler_file(Path(text).expanduser())
    else:
        normalised = _normalise_address(text)
        if normalised is None:
            raise UsageError(
                f"{str(address)!r} is not a Dask scheduler address; use {_EXPECTED_FORM}."
            )
        target = normalised
    if target.startswith("tls://") and security is None:
        raise PetmodelError(f"{target} needs TLS: give a CA file, certificate and key (--tls-ca-file, "
                            "--tls-cert, --tls-key or PETMODEL_TLS_* variables).")
    try:
        client = _PetmodelClient(target, timeout=timeout, start_limit=timeout, own_loop=True,
                                 security=security)
    except ImportError as err:  # the scheduler refused us, e.g. over package versions
        raise PetmodelError(
            f"The Dask scheduler at {target} refused this client ({err}); install the same "
            "dask and distributed versions here as on the cluster."
        ) from err
    except OSError as err:  # refused, timed out, or unreachable (TimeoutError included)
        raise PetmodelError(
            f"Could not reach a Dask scheduler at {target} within {timeout:g} s; check the "
            "address and that the scheduler is running."
        ) from err
    except Exception as err:  # something answered but spoke another protocol
        raise PetmodelError(
            f"Something at {target} answered, but not as a Dask scheduler; check the "
            "address and port."
        ) from err
    try:
        _prepare_remote(client, timeout, ship)
    except BaseException:
        shutdown(client)
        raise
    return client


def _prepare_remote(client: Client, timeout: float, ship: bool) -> None:
    """Versions, code, torch tuning; the findings stay on the client for the Cluster page."""
    from petmodel.dist import shipping, versions
    from petmodel.dist.workers import worker_addresses

    workers = worker_addresses(client, timeout=timeout)
    rows = versions.collect(client, workers, timeout=timeout)
    versions.check(rows)
    client.petmodel_versions = rows  # type: ignore[attr-defined]
    if ship:
        client.petmodel_code_hash = shipping.ship(client, workers, timeout=timeout)  # type: ignore[attr-defined]
    _register_torch_threads(client, timeout)


def shutdown(client: Client | None) -> None:
    """Close ``client`` and, if it owns one, its cluster; never raises.

    Meant for ``finally`` blocks and app teardown, where a second error would only hide
    the first. Safe to call twice.
    """
    if client is None:
        return
    try:
        client.close()  # a client from start_local_cluster also closes its cluster here
    except Exception:
        log.warning("Closing the Dask client failed", exc_info=True)


def dashboard_link(client: Client) -> str | None:
    """URL of the cluster's dashboard, or ``None`` when it has none or the client is closed.

    A closed client still remembers its cluster's last link, which no longer leads anywhere.
    """
    if client.status != "running":
        return None
    try:
        return client.dashboard_link or None
    except Exception:  # no dashboard service, or a client that is closing
        return None
