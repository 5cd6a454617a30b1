"""What the Streamlit app shares across sessions: the run store, the Dask client, the runs it drives.

The app keeps one :class:`AppBackend` per store folder for the whole server process
(``petmodel.app.server_state``, out of reach of Streamlit's cache clearing). A run's state lives in the store and in the
process-wide registry of live runs (:mod:`petmodel.cluster.registry`), not in a browser
session, so a run survives page reloads and closed tabs.

It is three parts: the cluster (:class:`petmodel.app.cluster_session.ClusterSession`: start,
connect, warm up, disconnect), the models (:class:`petmodel.app.models.ModelQueries`: list, load,
generate, score), and here the runs and studies this process launches and watches, plus the
cached cluster summary every page shows. Nothing here imports Streamlit; every expected failure
is a :class:`~petmodel.errors.PetmodelError` whose message is one sentence for the user.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from petmodel.app.cluster_summary import ClusterSummary
from petmodel.app.cluster_session import ClusterSession
from petmodel.app.links import is_run_id
from petmodel.app.models import ModelQueries, available_models
from petmodel.app.pending import CANCELLED, PendingLaunch
from petmodel.cluster import registry
from petmodel.errors import LaunchCancelled, PetmodelError, UsageError
from petmodel.status import RunStatus
from petmodel.store import RunRecord, RunStore, default_store_dir
from petmodel.studies.sizing import local_study_cluster

if TYPE_CHECKING:
    from collections.abc import Callable

    from petmodel.cluster.launch import RunHandle
    from petmodel.config import RunSpec
    from petmodel.resume import Resume
    from petmodel.studies import SearchConfig, StudyHandle, SweepConfig

__all__ = ["AppBackend", "available_models", "shutdown_all"]

SUMMARY_TTL_S = 2.0  # every page render shows the status: ask the scheduler at most this often
SUMMARY_TIMEOUT_S = 3.0
LOG_TIMEOUT_S = 3.0  # a failed run's page waits at most this long for its worker's log

_backends: weakref.WeakSet[AppBackend] = weakref.WeakSet()
_backends_lock = threading.Lock()


class AppBackend(ClusterSession, ModelQueries):
    """The run store, the Dask client and the runs and studies this process drives; safe to share
    across threads.

    ``warmup``: warm a new cluster up with a tiny DDP run (default: ``$PETMODEL_WARMUP``, on
    unless set to 0); tests turn it off.
    """

    def __init__(self, store_root: str | os.PathLike[str] | None = None, *, warmup: bool | None = None) -> None:
        super().__init__(warmup=warmup)
        self.store = RunStore(store_root or default_store_dir())
        try:
            self.store.reconcile_orphans()  # runs and studies whose process died show as failed, not running
        except PetmodelError as err:  # a busy store, a bad $PETMODEL_STALE_RUN_S: the app opens, the log says why
            logging.getLogger(__name__).warning("%s", err)
        with _backends_lock:
            _backends.add(self)

    def __repr__(self) -> str:
        return f"AppBackend(store={str(self.store.root)!r}, cluster={self._kind or 'none'})"

    # ---- cluster status ------------------------------------------------------------------------
    def summary(self) -> ClusterSummary:
        """Cluster status at a glance; never raises (a vanished scheduler gives connected False + error)."""
        client, kind = self._client, self._kind
        if client is None:
            return ClusterSummary()
        cached = self._summary
        if cached is not None and time.monotonic() - cached[0] < SUMMARY_TTL_S:
            return cached[1]
        from petmodel.cluster.connect import dashboard_link
        from petmodel.cluster.workers import describe_workers

        try:
            workers = describe_workers(client, timeout=SUMMARY_TIMEOUT_S)
            out = ClusterSummary(connected=True, kind=kind, scheduler=self._address, workers=len(workers),
                                 threads=sum(w.nthreads for w in workers), gpus=sum(w.gpu_count for w in workers),
                                 dashboard=dashboard_link(client),
                                 versions=getattr(client, "petmodel_versions", None),  # set by a remote connect
                                 code_hash=getattr(client, "petmodel_code_hash", None),
                                 scaling=scaler.describe() if (scaler := self.scaler()) is not None else None,
                                 gateway_cluster=self.gateway_cluster)
        except PetmodelError as err:
            out = ClusterSummary(kind=kind, scheduler=self._address, error=str(err))
        except Exception as err:  # noqa: BLE001 - the status line must never take a page down
            out = ClusterSummary(kind=kind, scheduler=self._address,
                                 error=f"The Dask scheduler at {self._address} stopped answering "
                                       f"({type(err).__name__}); reconnect or restart the cluster.")
        self._summary = (time.monotonic(), out)
        return out

    @overload
    def launch(self, spec: RunSpec, *, threads_per_worker: int = 1, wait: Literal[False] = False) -> str: ...
    @overload
    def launch(self, spec: RunSpec, *, threads_per_worker: int = 1, wait: Literal[True]) -> PendingLaunch: ...

    def launch(self, spec: RunSpec, *, threads_per_worker: int = 1, wait: bool = False) -> str | PendingLaunch:
        """Start ``spec`` on ``spec.workers`` workers in the background; returns the run id.

        Starts the embedded local cluster first when none is connected. Raises PetmodelError
        (or UsageError) before anything runs when the request is impossible, or when the workers
        are busy. ``wait``: queue for busy workers instead (another tab's or the CLI's run holds
        them); everything then happens in a background thread and a :class:`PendingLaunch` comes
        back at once (see :meth:`pending_launch`, :meth:`cancel_launch`), so a page never blocks.
        """
        if wait:
            return self._launches.submit(lambda on_queue, cancel, on_scale: self._start_run(
                spec, threads_per_worker, None, on_queue=on_queue, cancel=cancel, on_scale=on_scale), "launch")
        return self._start_run(spec, threads_per_worker, None)

    def pending_launch(self, launch_id: Any) -> PendingLaunch | None:
        """The launch a page started with ``wait=True`` (its id kept in the session); None once forgotten."""
        return self._launches.get(launch_id)

    def cancel_launch(self, launch_id: Any) -> bool:
        """Stop a queued launch waiting; False when it is unknown or already over (a started run keeps running)."""
        pending = self._launches.get(launch_id)
        return pending is not None and pending.cancel()

    def resumable(self, run_id: Any) -> bool:
        """Whether the page should offer Resume for ``run_id``: it stopped and left a snapshot.

        Never raises: a bad id or an unreadable store simply offers nothing.
        """
        from petmodel.resume import resumable

        if not is_run_id(run_id):
            return False
        try:
            return resumable(self.store, run_id)
        except PetmodelError:
            return False

    @overload
    def resume(self, run_id: str, *, threads_per_worker: int = 1, wait: Literal[False] = False,
               **overrides: Any) -> str: ...
    @overload
    def resume(self, run_id: str, *, threads_per_worker: int = 1, wait: Literal[True],
               **overrides: Any) -> PendingLaunch: ...

    def resume(self, run_id: str, *, threads_per_worker: int = 1, wait: bool = False,
               **overrides: Any) -> str | PendingLaunch:
        """Continue ``run_id`` from its latest snapshot as a new run (linked by ``resumed_from``); its id.

        ``overrides`` as for :func:`petmodel.resume.prepare_resume` (``max_seconds=``, ``epochs=``,
        ``workers=``, …; None keeps the run's). The same path as :meth:`launch` after that, so a
        resumed run queues (``wait``), trains and survives lost workers like any other. Raises
        PetmodelError (one sentence) when the run cannot be continued; that is checked here, before
        any queueing.
        """
        from petmodel.resume import prepare_resume

        if not is_run_id(run_id):
            raise UsageError("Pick a run to resume.")
        spec, resume = prepare_resume(self.store, run_id, **overrides)
        if wait:
            return self._launches.submit(lambda on_queue, cancel, on_scale: self._start_run(
                spec, threads_per_worker, resume, on_queue=on_queue, cancel=cancel, on_scale=on_scale),
                f"resume of {run_id}")
        return self._start_run(spec, threads_per_worker, resume)

    def _start_run(self, spec: RunSpec, threads_per_worker: int, resume: Resume | None, *,
                   on_queue: Callable[[int, list[str]], None] | None = None,
                   cancel: threading.Event | None = None, on_scale: Callable[[str], None] | None = None) -> str:
        """What a new and a resumed run share: the data, a cluster (started if need be), the launch.

        With ``cancel`` (a queued launch, in its own thread) busy workers are waited for in the
        scheduler's queue, reporting its place to ``on_queue``; without it they refuse the launch. A
        cluster that can scale is asked for missing workers first, which ``on_scale`` hears of.
        """
        from petmodel.cluster.launch import launch_run

        if spec.workers < 1:  # the app always trains on the cluster (an in-process run resumes on one worker)
            spec = spec.with_(workers=1)
        corpus = self.corpus(spec.data)  # before the cluster: a bad data path fails fast
        if cancel is not None and cancel.is_set():  # cancelled (or disconnected) before a cluster was started
            raise LaunchCancelled(CANCELLED)
        client = self.ensure_cluster(spec.workers, threads_per_worker)
        self.wait_warm()  # the warm-up run holds the workers for a few seconds after a cluster starts
        handle = launch_run(client, spec, self.store, corpus=corpus, resume=resume, wait=cancel is not None,
                            on_queue=on_queue, cancel=cancel, on_scale=on_scale)
        self._summary = None
        return handle.run_id

    # ---- studies -------------------------------------------------------------------------------
    def study_workers(self, config: SweepConfig | SearchConfig | None = None, *,
                      cluster_workers: int | None = None) -> int:
        """The workers a study would run on: the connected cluster's, else those of the embedded cluster
        :meth:`start_study` would start for ``config`` (None: the most a sweep may get here)."""
        summary = self.summary()
        if summary.connected and summary.workers:
            return int(summary.workers)
        return local_study_cluster(config, cluster_workers=cluster_workers).n_workers

    def start_study(self, config: SweepConfig | SearchConfig, *, cluster_workers: int | None = None,
                    threads_per_worker: int = 1) -> StudyHandle:
        """Start a sweep or a search in the background of this process; its handle (it survives reloads).

        With no cluster connected, the embedded one starts sized and tuned exactly as
        ``python -m petmodel sweep``/``search`` start theirs (:func:`petmodel.studies.sizing.
        local_study_cluster`; ``cluster_workers`` is the search's ``--cluster-workers``), so a study
        times the same from the page and from the CLI. The data is read first: a bad path fails
        before a cluster starts.
        """
        from petmodel.studies import SearchConfig, start_search, start_sweep

        corpus = self.corpus(config.base.data)
        local = local_study_cluster(config, threads_per_worker=threads_per_worker, cluster_workers=cluster_workers)
        client = self.ensure_study_cluster(local)
        start = start_search if isinstance(config, SearchConfig) else start_sweep
        handle = start(client, self.store, config, corpus=corpus)
        self._summary = None
        return handle

    # ---- runs ----------------------------------------------------------------------------------
    def wait_for_metrics(self, run_id: str, timeout: float = 1.5) -> bool:
        """Wait (briefly) until ``run_id`` has a training metric in the store; True if it has one."""
        deadline = time.monotonic() + timeout
        while True:
            if self.store.metrics(run_id, kind="train")[:1]:
                return True
            if time.monotonic() >= deadline or not self.is_active(run_id):
                return False
            time.sleep(0.05)

    def handle(self, run_id: str) -> RunHandle | None:
        """The live handle of a run this process drives (None once it ended, or for runs driven elsewhere)."""
        return cast("RunHandle | None", registry.get_run(run_id) if is_run_id(run_id) else None)

    def is_active(self, run_id: str) -> bool:
        handle = self.handle(run_id)
        return handle is not None and not handle.done()

    def active_runs(self) -> list[str]:
        """Ids of the runs of this backend's store that this process is driving now."""
        return [h.run_id for h in registry.live_runs() if h.store.root == self.store.root]

    def cancel(self, run_id: str) -> bool:
        """Ask a running run to stop; False when this process does not drive it (or it already ended)."""
        handle = self.handle(run_id)
        if handle is None or handle.done():
            return False
        handle.cancel()
        return True

    def rank_states(self, run_id: str) -> dict[int, str]:
        """Each rank's task state as this process sees it (empty for runs it does not drive)."""
        handle = self.handle(run_id)
        return handle.rank_states() if handle is not None else {}

    def failed_rank_log(self, run_id: str, lines: int = 20, timeout: float = LOG_TIMEOUT_S) -> list[str]:
        """The last ``lines`` log lines of the worker whose rank failed ``run_id`` (else rank 0's).

        Fetched from the worker through the scheduler (``Client.get_worker_logs``) in a helper
        thread, so a slow or gone cluster costs at most ``timeout`` seconds; empty when the
        worker (or the cluster) is gone, or the run is not a failed run on workers.
        """
        import concurrent.futures

        run = self.run_or_none(run_id)
        client = self._client
        if run is None or client is None or run.status != RunStatus.FAILED:
            return []
        worker = run.failed_worker or (run.workers[0] if run.workers else None)
        if not worker or "://" not in worker:
            return []
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="petmodel-app-logs")
        try:
            logs = pool.submit(client.get_worker_logs, n=lines, workers=[worker]).result(timeout)
        except Exception:  # noqa: BLE001 - no log is better than a page that fails
            return []
        finally:
            pool.shutdown(wait=False)
        entries = logs.get(worker) if isinstance(logs, dict) else None
        if not isinstance(entries, (list, tuple)):
            return []
        # Newest first from the worker: turn them into reading order.
        text = [str(e[1]) if isinstance(e, (list, tuple)) and len(e) == 2 else str(e) for e in reversed(entries)]
        return [line for entry in text for line in entry.splitlines()][-lines:]

    def delete_runs(self, run_ids: list[str]) -> list[str]:
        """Delete finished runs with their files (:meth:`RunStore.delete_runs`: all or nothing, one sentence).

        A run this process still drives is refused even if its row already says it ended.
        """
        going = [i for i in run_ids if self.is_active(i)]
        if going:
            raise PetmodelError(f"Run {going[0]} is still running; cancel it and wait until it stops before "
                                "deleting it.")
        return self.store.delete_runs(run_ids)

    def delete_study(self, study_id: str) -> list[str]:
        """Delete a finished study and its runs with their files (:meth:`RunStore.delete_study`)."""
        return self.store.delete_study(study_id)

    def model_bundle(self, run_id: str) -> bytes:
        """``run_id``'s model as a download: checkpoint and settings in a zip (:mod:`petmodel.app.downloads`)."""
        from petmodel.app.downloads import model_bundle

        return model_bundle(self.store, run_id)

    def run_or_none(self, run_id: Any) -> RunRecord | None:
        """The store's record of ``run_id``, or None when the value is not a run id or unknown."""
        if not is_run_id(run_id):
            return None
        try:
            return self.store.get_run(run_id)
        except PetmodelError:
            return None


def shutdown_all() -> None:
    """Close every backend of this process (their runs, clusters and clients); for tests and exit."""
    with _backends_lock:
        backends = list(_backends)
    for backend in backends:
        backend.close()


atexit.register(shutdown_all)  # the app server exits: cancel its runs and stop its local cluster
