"""Ending the worker of one rank of a running run, on purpose, so a user can watch the run recover.

The point is to see the elastic recovery a real loss sets off (the group re-formed, the restart
marker on the charts, the time lost), so the kill must look like a real loss and take no short
cut through the supervisor: the worker's process ends at once with no clean-up (``os._exit``, as a
crash or the kernel's OOM killer would end it), the scheduler notices the lost connection and drops
the worker, and the run's supervisor finds its rank gone as it does for any lost worker
(:mod:`petmodel.cluster.rank_group`), then re-forms on the rest plus any free worker. A worker under
a nanny (a ``LocalCluster``'s, ``dask worker``'s default) comes back as a new worker, free for the
next re-form; one without stays gone.

The exit is delayed by :data:`EXIT_DELAY_S` so the call that asks for it can answer first: the
caller learns that the worker got the order (and its process id), not a dropped connection that
could mean anything. Owner and admins only, on the Train page (``pages/train.py``); the CLI's
``runs kill-worker`` is for scripts and tests.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from petmodel.cluster.calls import CALL_TIMEOUT_S, NoAnswer, run_each
from petmodel.errors import PetmodelError, UsageError
from petmodel.status import RunStatus

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.store import RunStore

EXIT_DELAY_S = 0.2  # the worker answers, then ends
KILLED_EXIT_CODE = 137  # what a SIGKILLed process reports: the worker died as if killed


@dataclass(frozen=True)
class KilledWorker:
    """The worker that was told to end: which run and rank it held, its address and process id."""

    run_id: str
    rank: int
    worker: str
    pid: int

    def sentence(self) -> str:
        return (f"Ended worker {self.worker} (process {self.pid}), rank {self.rank} of run {self.run_id}; the run "
                "re-forms on the remaining workers if it has restarts left.")


def _exit_soon(delay_s: float, code: int) -> int:
    """Runs on the worker: end this process ``delay_s`` from now, with no clean-up; its process id now."""
    threading.Timer(delay_s, os._exit, args=(code,)).start()
    return os.getpid()


def rank_worker(store: RunStore, run_id: str, rank: int) -> str:
    """The address of the worker that holds ``rank`` of the running run ``run_id`` now (the store's record,
    which a re-formed run updates); a one-sentence error when there is none to end."""
    run = store.get_run(run_id)
    if run is None:
        raise PetmodelError(f"No run called {run_id!r} in the store {store.root}.")
    if run.status != RunStatus.RUNNING:
        raise PetmodelError(f"Run {run_id} is {run.status}, not running: it has no worker to end.")
    workers = [w for w in run.workers if w != "local"]
    if not workers or run.backend == "local":
        raise PetmodelError(f"Run {run_id} trains in-process, not on Dask workers: there is no worker to end.")
    if not 0 <= rank < len(workers):
        raise UsageError(f"Run {run_id} has ranks 0 to {len(workers) - 1}; there is no rank {rank}.")
    return workers[rank]


def kill_rank(client: Client, store: RunStore, run_id: str, rank: int) -> KilledWorker:
    """End the worker process that holds ``rank`` of ``run_id`` (see the module docstring for why this way).

    ``client`` must be connected to the cluster the run trains on; the worker's answer says it got the
    order. A PetmodelError when the run has no such worker or it does not answer.
    """
    address = rank_worker(store, run_id, rank)
    from petmodel.cluster.workers import describe_workers

    live = {w.address for w in describe_workers(client, timeout=CALL_TIMEOUT_S, probe_gpus=False)}
    if address not in live:
        raise PetmodelError(f"Worker {address} (rank {rank} of run {run_id}) is not in this cluster; it may be gone "
                            "already, or the run trains on another cluster (give its --scheduler).")
    answer = run_each(client, _exit_soon, [address], timeout=CALL_TIMEOUT_S, delay_s=EXIT_DELAY_S,
                      code=KILLED_EXIT_CODE)[address]
    if isinstance(answer, NoAnswer):
        raise PetmodelError(f"Worker {address} did not take the order to end ({answer.reason}).")
    return KilledWorker(run_id, rank, address, int(answer))


def scheduler_of(worker: str, *, timeout: float = CALL_TIMEOUT_S) -> str:
    """The address of the scheduler ``worker`` (a ``tcp://`` address) reports to, asked of the worker itself.

    Lets ``runs kill-worker`` find the embedded cluster of a ``train --workers`` in another shell,
    whose scheduler address nobody wrote down. A TLS worker needs its certificates: give
    ``--scheduler`` (and the TLS flags) instead.
    """
    if not worker.startswith("tcp://"):
        raise UsageError(f"Worker {worker} is not a plain tcp:// address; give the run's --scheduler.")
    import asyncio

    from petmodel.compat import worker_identity

    async def ask() -> str:
        return str((await worker_identity(worker, timeout=timeout))["scheduler"])

    # On a thread of its own: its event loop is fresh whatever the caller's thread holds (a caller inside
    # a running loop, or one a Dask client or Streamlit set up, would make asyncio.run refuse).
    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(1, thread_name_prefix="petmodel-scheduler-of") as pool:
            return pool.submit(asyncio.run, ask()).result(timeout * 2 + 5)
    except Exception as err:  # noqa: BLE001 - one sentence, whatever went wrong
        logging.getLogger(__name__).debug("asking %s for its scheduler failed: %r", worker, err)
        raise PetmodelError(f"Worker {worker} did not say which scheduler it belongs to ({type(err).__name__}); "
                            "give the run's --scheduler.") from None
