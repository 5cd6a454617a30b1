"""Every use of a Dask or torch internal (a private or undocumented API), each with the reason for it.

A new release of distributed or torch may rename or remove any of these without notice, so they
live here and nowhere else, and ``tests/test_compat.py`` has one test per internal that fails the
day it changes (rather than a run hanging for 30 minutes, or a shipped zip silently not reaching
new workers). Each function says why the public API does not do, and what breaks without it.

Two internals cannot live here: code that runs on a scheduler that may not have ``petmodel``
travels *by value* (cloudpickle) and must import only the standard library, so it cannot import
this module. They are listed in :data:`BY_VALUE_INTERNALS` and tested like the others.

No Streamlit internal is used: the pages use only ``st.*`` (and ``streamlit.testing`` in tests),
and the library never imports Streamlit. Importing this module imports neither torch nor
distributed; each function imports what it touches.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Client, Worker
    from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

__all__ = [
    "BY_VALUE_INTERNALS",
    "register_scheduler_plugin",
    "register_worker_plugin",
    "scheduler_address",
    "scheduler_identity",
    "set_default_process_group_timeout",
    "task_released",
    "worker_nthreads",
]

BY_VALUE_INTERNALS: dict[str, str] = {
    "petmodel.cluster.probes.registered_zip": (
        "reads Scheduler.worker_plugins (name → pickled plugin) to learn which zip the scheduler hands to "
        "workers that join later; no public API lists registered plugins"),
    "petmodel.cluster.reservation_state._reservations": (
        "reads Scheduler.clients and Scheduler.workers (keyed by client id and worker address) to drop the "
        "reservations of clients and workers that are gone, and keeps its state as an attribute it sets on the "
        "Scheduler object; the scheduler has no public store for a plugin-less extension's state"),
}
"""Internals used by functions that travel by value to the scheduler (standard library only): where, and why."""


# --------------------------------------------------------------------------- distributed: plugins
def register_scheduler_plugin(client: Client, plugin: SchedulerPlugin, *, name: str,
                              idempotent: bool = False) -> Awaitable[Any]:
    """The coroutine that registers ``plugin`` on the scheduler (``Client._register_scheduler_plugin``).

    Why private: ``Client.register_plugin`` (public) cannot be bounded by a timeout, so one frozen
    worker hangs it forever; awaiting this coroutine under ``client.sync(..., callback_timeout=…)``
    (or inside a coroutine that is) can be. Await it on the client's event loop.
    """
    return client._register_scheduler_plugin(plugin, name=name, idempotent=idempotent)


def register_worker_plugin(client: Client, plugin: WorkerPlugin, *, name: str,
                           idempotent: bool = False) -> Awaitable[Any]:
    """The coroutine that registers ``plugin`` on every worker, now and later (``Client._register_worker_plugin``).

    Why private: as :func:`register_scheduler_plugin`; the public ``register_plugin`` waits for every
    worker without a bound, and the scheduler's broadcast waits forever on a frozen one.
    """
    return client._register_worker_plugin(plugin, name=name, idempotent=idempotent)


# --------------------------------------------------------------------------- distributed: the scheduler
def scheduler_identity(client: Client, *, timeout: float) -> dict[str, Any]:
    """The scheduler's description of itself and of every worker (its ``identity`` handler), within ``timeout``.

    Why private: ``client.scheduler`` is the client's RPC handle on the scheduler, and
    ``identity(n_workers=-1)`` the handler behind ``Client.scheduler_info()``. That public method
    cannot be bounded by a timeout and silently returns a stale cache when the scheduler is
    unreachable. Raises ``OSError`` (``TimeoutError`` included) when the scheduler does not answer.
    """
    return client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout)


def scheduler_address(client: Client) -> str:
    """The address of the scheduler this client talks to (``client.scheduler.address``).

    Why private: the only public spellings are ``Client.scheduler_info()["address"]`` (a cache that
    may be empty or stale, or a blocking round trip) and ``client.cluster.scheduler_address`` (only
    when the client started the cluster); the RPC handle's address is always current.
    """
    return str(client.scheduler.address)


# --------------------------------------------------------------------------- distributed: worker processes
FORKSERVER_PRELOAD = ("distributed", "torch")


def preload_forkserver(modules: tuple[str, ...] = FORKSERVER_PRELOAD) -> bool:
    """Let nannies fork worker processes from a server that imported ``modules`` once; False where it cannot.

    Why: a spawned worker imports distributed and torch anew, about 2 s of CPU each, so every cluster
    start paid seconds per worker. Dask supports ``distributed.worker.multiprocessing-method:
    forkserver`` but preloads only its own dependencies, and ``distributed.utils.get_mp_context``
    sets that list the first time it is called (a private flag keeps it from doing so again). So
    call it first, then replace the list through multiprocessing's public ``set_forkserver_preload``
    before the server starts. Linux only (forking a process that imported torch is not safe on
    macOS). A forked worker gets the environment the server started with plus what its nanny sets
    (``distributed.nanny.environ`` and ``pre-spawn-environ``), not later changes to this process's.
    """
    import multiprocessing
    import sys

    import dask
    from distributed import utils

    if not sys.platform.startswith("linux") or "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        context = utils.get_mp_context()
    context.set_forkserver_preload(list(modules))
    return True


# --------------------------------------------------------------------------- distributed: a worker
def worker_nthreads(worker: Worker) -> int:
    """The threads ``worker`` runs tasks on (0 when it cannot say).

    Why internal: today's distributed keeps the count on the worker's state machine
    (``worker.state.nthreads``), which is not documented; older releases had ``worker.nthreads``.
    Training sets torch's thread count from it, so several ranks on one machine do not fight over cores.
    """
    state = getattr(worker, "state", None)
    nthreads = getattr(state, "nthreads", None) or getattr(worker, "nthreads", None)
    return int(nthreads or 0)


def task_released(worker: Worker) -> bool:
    """Whether the task this thread runs is no longer wanted: its client released or cancelled it.

    Why internal: a worker cannot stop a running task's thread; when the scheduler lets go of the task (its
    client disconnected: a killed CLI, or a frozen scheduler that resumed after the client gave up) the worker
    only marks it ``"cancelled"`` on its state machine (``worker.state.tasks[key].state``, undocumented) and
    waits for it to return. No public API says so, and without it a rank trains on for the rest of its budget
    for nobody, taking the workers' cores. ``Worker.get_current_task`` is public. False when it cannot tell.
    """
    try:
        key = worker.get_current_task()
        task = worker.state.tasks.get(key)
    except Exception:  # noqa: BLE001 - not in a task, or another distributed: keep training
        return False
    return task is None or task.state in ("cancelled", "released", "forgotten")


# --------------------------------------------------------------------------- torch.distributed
def set_default_process_group_timeout(seconds: float) -> None:
    """Lower the default timeout ``init_process_group`` reads, in this process.

    Why internal: ``dask_pytorch_ddp.dispatch.dispatch_with_ddp`` calls ``init_process_group`` with no
    timeout and takes no option for one, so a rank whose peer never joins (or died silently) would
    wait torch's default of 30 minutes. ``init_process_group`` then falls back to the module defaults
    ``torch.distributed.distributed_c10d.default_pg_timeout`` (and ``default_pg_nccl_timeout`` for
    NCCL, in releases that have it), for the rendezvous and every collective, so we set those.
    """
    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timedelta(seconds=seconds)
    if hasattr(c10d, "default_pg_nccl_timeout"):
        c10d.default_pg_nccl_timeout = timedelta(seconds=seconds)
