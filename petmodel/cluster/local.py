"""The embedded cluster: worker *processes* on this machine, sized by its cores (or one per GPU).

Training runs one DDP rank per Dask worker process, tuned for training
(:mod:`petmodel.cluster.tuning`). A client returned by :func:`start_local_cluster` owns its
cluster: closing it (:func:`petmodel.cluster.connect.shutdown`) stops the workers too.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import dask
from distributed import Client, LocalCluster

from petmodel.cluster.client import PetmodelClient
from petmodel.cluster.tuning import LOCAL_WORKER_CONFIG, PLUGIN_NAME, TorchThreadsPlugin
from petmodel.compat import preload_forkserver, register_worker_plugin, sync_within
from petmodel.errors import UsageError
from petmodel.settings import env_number, require_whole


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
    default = RANKS_PER_CORE_LIMIT * local_capacity(threads_per_worker)
    return env_number(MAX_LOCAL_WORKERS_ENV, default, kind=int, minimum=1, unit="workers")


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
    return require_whole(name, value, rule="a whole number of at least 1")


def _shipped_torch_threads() -> Any:
    """A worker plugin that runs :class:`TorchThreadsPlugin` once ``petmodel`` imports on the worker.

    For a cluster whose workers get ``petmodel`` only from the shipped zip: a worker that joins later
    sets its plugins up all at once, so it would unpickle ``TorchThreadsPlugin`` before the zip's
    plugin has loaded the package, fail with "No module named 'petmodel'" and stop (seen on a Dask
    Gateway cluster scaled up after connecting). This class is made inside a function, so it travels
    by value, needing only the standard library and distributed on the worker.
    """
    from distributed import WorkerPlugin

    class ShippedTorchThreads(WorkerPlugin):
        async def setup(self, worker: Any) -> None:
            import asyncio
            import importlib
            import inspect

            for _ in range(600):  # the zip's plugin loads petmodel within moments; give up after a minute
                try:
                    tuning = importlib.import_module("petmodel.cluster.tuning")
                except ImportError:
                    await asyncio.sleep(0.1)
                    continue
                result = tuning.TorchThreadsPlugin().setup(worker)
                if inspect.isawaitable(result):
                    await result
                return

    return ShippedTorchThreads()


def register_torch_threads(client: Client, timeout: float = 30.0, *, shipped: bool = False) -> None:
    """Register :class:`TorchThreadsPlugin`, bounded by ``timeout``; warn rather than fail.

    ``shipped``: the workers get ``petmodel`` from the shipped zip, so register the variant that
    waits for it (:func:`_shipped_torch_threads`). Workers that cannot unpickle it (no petmodel
    there) will also fail to train, but that is for training to report; describing the cluster
    still works. A frozen worker makes the scheduler's broadcast wait forever, hence the bound.
    """
    plugin = _shipped_torch_threads() if shipped else TorchThreadsPlugin()
    try:
        sync_within(client, register_worker_plugin, client, plugin, name=PLUGIN_NAME, timeout=timeout)
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
    Workers start with :data:`~petmodel.cluster.tuning.LOCAL_WORKER_CONFIG`, then ``config`` on
    top (e.g. :data:`~petmodel.cluster.tuning.TIMING_CLUSTER_CONFIG`); pass settings here rather
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
    settings = dict(LOCAL_WORKER_CONFIG)
    if cluster_factory is LocalCluster:
        common["processes"] = True
        if preload_forkserver():  # workers fork from a process that has imported torch: no import each
            settings["distributed.worker.multiprocessing-method"] = "forkserver"
    common["host"] = "127.0.0.1"  # the embedded cluster (and its dashboard) is for this machine only
    with dask.config.set({**settings, **(config or {})}):
        cluster = cluster_factory(**common)
    try:
        client = PetmodelClient(cluster)
    except BaseException:
        cluster.close()
        raise
    client.own(cluster)
    client.petmodel_worker_config = {**settings, **(config or {})}  # what workers added by a scale-up start with
    register_torch_threads(client)
    return client


def local_scaler(client: Client, config: Any = None, *, threads_per_worker: int = 1, floor: int | None = None) -> Any:
    """A :class:`~petmodel.cluster.scaling.ClusterScaler` for the embedded cluster ``client`` owns, attached to it.

    Launches then grow the cluster up to ``config.max_workers`` (never past :func:`max_local_workers`),
    and the workers they added go again once no run has held them for the grace period.
    """
    from petmodel.cluster import scaling
    from petmodel.config import ScalingConfig

    config = config or ScalingConfig.from_env()
    limit = max_local_workers(max(1, threads_per_worker))
    if config.max_workers > limit:
        config = ScalingConfig(max_workers=limit, grace_s=config.grace_s, join_timeout_s=config.join_timeout_s)
    scaler = scaling.ClusterScaler(client, client.cluster, config, floor=floor,
                                   worker_config=getattr(client, "petmodel_worker_config", None))
    return scaling.attach(client, scaler)


