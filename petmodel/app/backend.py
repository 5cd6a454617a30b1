"""What the Streamlit app shares across sessions: the run store, the Dask client, the runs it drives.

The app keeps one :class:`AppBackend` per store folder for the whole server process
(``st.cache_resource`` in ``pages/_ui.py``). A run's state lives in the store and in the
process-wide registry of live runs (:mod:`petmodel.cluster.registry`), not in a browser
session, so a run survives page reloads and closed tabs.

Nothing here imports Streamlit; every expected failure is a
:class:`~petmodel.errors.PetmodelError` whose message is one sentence for the user.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from petmodel.app import loaders
from petmodel.app.forms import default_data_path
from petmodel.app.links import GenerateSettings, is_run_id
from petmodel.app.pending import CANCELLED, LaunchQueue, PendingLaunch
from petmodel.app.tables import worker_rows
from petmodel.app.warmup import WARMUP_TIMEOUT_S, warm_cluster, warmup_enabled
from petmodel.cluster import registry
from petmodel.errors import PetmodelError, UsageError
from petmodel.store import RunRecord, RunStore, default_store_dir

if TYPE_CHECKING:
    from collections.abc import Callable

    from distributed import Client

    from petmodel.checkpoint import Checkpoint
    from petmodel.config import RunSpec
    from petmodel.data import NameCorpus
    from petmodel.cluster.launch import RunHandle
    from petmodel.generate import Generated
    from petmodel.resume import Resume
    from petmodel.score import NameScore

__all__ = ["AppBackend", "available_models", "shutdown_all"]

SUMMARY_TTL_S = 2.0  # every page render shows the status: ask the scheduler at most this often
SUMMARY_TIMEOUT_S = 3.0
LOG_TIMEOUT_S = 3.0  # a failed run's page waits at most this long for its worker's log

_backends: weakref.WeakSet[AppBackend] = weakref.WeakSet()
_backends_lock = threading.Lock()


class AppBackend:
    """The run store, the Dask client and the runs this process drives; safe to share across threads.

    ``warmup``: warm a new cluster up with a tiny DDP run (default: ``$PETMODEL_WARMUP``, on
    unless set to 0); tests turn it off.
    """

    connect_timeout_s = 10.0  # how long Connect waits for an unreachable scheduler (Dask retries meanwhile)

    def __init__(self, store_root: str | os.PathLike[str] | None = None, *, warmup: bool | None = None) -> None:
        self.store = RunStore(store_root or default_store_dir())
        try:
            self.store.reconcile_orphans()  # runs and studies whose process died show as failed, not running
        except PetmodelError:
            pass
        self.warmup = warmup_enabled() if warmup is None else warmup
        self._lock = threading.RLock()
        self._client: Client | None = None
        self._kind: str | None = None  # "local" (we own the cluster) or "remote"
        self._address: str | None = None
        self._summary: tuple[float, dict[str, Any]] | None = None
        self._warm_thread: threading.Thread | None = None
        self._launches = LaunchQueue()  # launches waiting for busy workers, found again by id after a rerun
        with _backends_lock:
            _backends.add(self)

    def __repr__(self) -> str:
        return f"AppBackend(store={str(self.store.root)!r}, cluster={self._kind or 'none'})"

    # ---- cluster -------------------------------------------------------------------------------
    @property
    def client(self) -> Client | None:
        return self._client

    @property
    def kind(self) -> str | None:
        """"local" for the embedded cluster this app owns, "remote" for a connected scheduler, else None."""
        return self._kind

    @property
    def connected(self) -> bool:
        return self._client is not None

    def _adopt(self, client: Client, kind: str) -> None:
        """Make ``client`` the current one (the caller holds the lock) and warm it up if asked to."""
        self._client, self._kind, self._address = client, kind, client.scheduler.address
        self._summary = None
        if self.warmup:
            self._warm_async(client)

    def _refuse_second_cluster(self) -> None:
        if self._client is not None:
            where = "the local cluster" if self._kind == "local" else self._address
            raise PetmodelError(f"Already using {where}; stop or disconnect it first.")

    def start_local(self, n_workers: int | None = None, threads: int | None = None) -> dict[str, Any]:
        """Start the embedded local cluster (worker processes on this machine); returns summary()."""
        from petmodel.cluster.local import start_local_cluster

        with self._lock:
            self._refuse_second_cluster()
            self._adopt(start_local_cluster(n_workers, threads), "local")
        return self.summary()

    def connect(self, address: str, timeout: float | None = None, *, tls_ca_file: str | None = None,
                tls_cert: str | None = None, tls_key: str | None = None) -> dict[str, Any]:
        """Connect to a running scheduler (tcp://, tls:// or a scheduler file); returns summary().

        TLS files not given come from the ``PETMODEL_TLS_*`` variables (petmodel.cluster.security).
        """
        from petmodel.cluster.connect import connect
        from petmodel.cluster.security import security_from

        if not isinstance(address, str) or not address.strip():
            raise UsageError("Enter a scheduler address such as tcp://10.0.0.5:8786.")
        security = security_from(tls_ca_file, tls_cert, tls_key)
        with self._lock:
            self._refuse_second_cluster()
            self._adopt(connect(address.strip(), timeout=timeout or self.connect_timeout_s, security=security),
                        "remote")
        return self.summary()

    def disconnect(self, *, wait_s: float = 20.0) -> None:
        """Cancel the runs on this cluster, then close the client (and the local cluster it owns)."""
        from petmodel.cluster.connect import shutdown

        with self._lock:
            client, self._client, self._kind, self._address = self._client, None, None, None
            self._summary = None
        self._launches.cancel_all()  # a queued launch must not outlive its cluster (or start a new one)
        if client is None:
            return
        self.wait_warm(wait_s)
        active = [h for h in registry.live_runs() if h.client is client]
        for handle in active:
            handle.cancel(reason="Cancelled: the cluster was stopped or disconnected.")
        deadline = time.monotonic() + wait_s
        for handle in active:
            handle.join(max(0.1, deadline - time.monotonic()))
        shutdown(client)

    def close(self) -> None:
        """Stop everything this backend started (for tests and server shutdown); never raises."""
        try:
            self.disconnect(wait_s=10.0)
        except Exception:  # noqa: BLE001 - teardown must not raise
            pass

    def _warm_async(self, client: Client) -> None:
        """Warm the new cluster up in the background (see :mod:`petmodel.app.warmup`); launches wait for it."""
        data = default_data_path()
        thread = threading.Thread(target=warm_cluster, args=(client,),
                                  kwargs={"then": (lambda: self.corpus(data)) if data else None},
                                  name="petmodel-app-warm", daemon=True)
        self._warm_thread = thread
        thread.start()

    def wait_warm(self, timeout: float = WARMUP_TIMEOUT_S) -> None:
        """Block until the background warm-up (if any) is over, at most ``timeout`` seconds."""
        thread = self._warm_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def summary(self) -> dict[str, Any]:
        """Cluster status at a glance; never raises (a vanished scheduler gives connected False + error)."""
        blank = {"connected": False, "kind": None, "scheduler": None, "workers": 0, "threads": 0, "gpus": 0,
                 "dashboard": None, "error": None, "versions": None, "code_hash": None}
        client, kind = self._client, self._kind
        if client is None:
            return blank
        cached = self._summary
        if cached is not None and time.monotonic() - cached[0] < SUMMARY_TTL_S:
            return dict(cached[1])
        from petmodel.cluster.connect import dashboard_link
        from petmodel.cluster.workers import describe_workers

        try:
            workers = describe_workers(client, timeout=SUMMARY_TIMEOUT_S)
            out = {"connected": True, "kind": kind, "scheduler": self._address, "workers": len(workers),
                   "threads": sum(w.nthreads for w in workers), "gpus": sum(w.gpu_count for w in workers),
                   "dashboard": dashboard_link(client), "error": None,
                   "versions": getattr(client, "petmodel_versions", None),  # set by a remote connect
                   "code_hash": getattr(client, "petmodel_code_hash", None)}
        except PetmodelError as err:
            out = {**blank, "kind": kind, "scheduler": self._address, "error": str(err)}
        except Exception as err:  # noqa: BLE001 - the status line must never take a page down
            out = {**blank, "kind": kind, "scheduler": self._address,
                   "error": f"The Dask scheduler at {self._address} stopped answering ({type(err).__name__}); "
                            "reconnect or restart the cluster."}
        self._summary = (time.monotonic(), out)
        return dict(out)

    def workers(self) -> list[dict[str, Any]]:
        """The cluster's workers as table rows (empty when not connected); PetmodelError if unreachable."""
        client = self._client
        if client is None:
            return []
        from petmodel.cluster.workers import describe_workers

        try:
            infos = describe_workers(client, timeout=SUMMARY_TIMEOUT_S)
        except PetmodelError:
            raise
        except Exception as err:  # noqa: BLE001
            raise PetmodelError(f"Could not list the workers ({type(err).__name__}); reconnect or restart "
                                "the cluster.") from err
        from petmodel.cluster.reservations import snapshot

        busy = registry.busy_workers()
        try:  # workers held by any client of the cluster, not only this app's runs
            busy |= set(snapshot(client)["held"])
        except Exception:  # noqa: BLE001 - this process's own runs are still shown
            pass
        return worker_rows(infos, busy)

    # ---- data and runs -------------------------------------------------------------------------
    def corpus(self, source: str | None) -> NameCorpus:
        """The cleaned, split names of ``source`` (None: the default data), loaded once per file version."""
        return loaders.corpus(source)

    def ensure_cluster(self, n_workers: int, threads: int = 1) -> Client:
        """The current client, starting the embedded local cluster with ``n_workers`` if there is none."""
        with self._lock:
            if self._client is None:
                self.start_local(max(1, n_workers), max(1, threads))
            assert self._client is not None
            return self._client

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
            return self._launches.submit(lambda on_queue, cancel: self._start_run(
                spec, threads_per_worker, None, on_queue=on_queue, cancel=cancel), "launch")
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
            return self._launches.submit(lambda on_queue, cancel: self._start_run(
                spec, threads_per_worker, resume, on_queue=on_queue, cancel=cancel), f"resume of {run_id}")
        return self._start_run(spec, threads_per_worker, resume)

    def _start_run(self, spec: RunSpec, threads_per_worker: int, resume: Resume | None, *,
                   on_queue: Callable[[int, list[str]], None] | None = None,
                   cancel: threading.Event | None = None) -> str:
        """What a new and a resumed run share: the data, a cluster (started if need be), the launch.

        With ``cancel`` (a queued launch, in its own thread) busy workers are waited for in the
        scheduler's queue, reporting its place to ``on_queue``; without it they refuse the launch.
        """
        from petmodel.cluster.launch import launch_run

        if spec.workers < 1:  # the app always trains on the cluster (an in-process run resumes on one worker)
            spec = spec.with_(workers=1)
        corpus = self.corpus(spec.data)  # before the cluster: a bad data path fails fast
        if cancel is not None and cancel.is_set():  # cancelled (or disconnected) before a cluster was started
            raise PetmodelError(CANCELLED)
        client = self.ensure_cluster(spec.workers, threads_per_worker)
        self.wait_warm()  # the warm-up run holds the workers for a few seconds after a cluster starts
        handle = launch_run(client, spec, self.store, corpus=corpus, resume=resume, wait=cancel is not None,
                            on_queue=on_queue, cancel=cancel)
        self._summary = None
        return handle.run_id

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
        return registry.get_run(run_id) if is_run_id(run_id) else None

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
        if run is None or client is None or run.status != "failed":
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

    def run_or_none(self, run_id: Any) -> RunRecord | None:
        """The store's record of ``run_id``, or None when the value is not a run id or unknown."""
        if not is_run_id(run_id):
            return None
        try:
            return self.store.get_run(run_id)
        except PetmodelError:
            return None

    # ---- models and names ----------------------------------------------------------------------
    def models(self) -> list[RunRecord]:
        """Completed runs whose model file exists, best validation NLL first."""
        return available_models(self.store)

    def checkpoint(self, run_id: str) -> Checkpoint:
        """The checkpoint of a run in the store (loaded once per file version); never a path from outside."""
        if not is_run_id(run_id):
            raise UsageError("Pick a model from the list of trained runs.")
        if self.store.get_run(run_id) is None:
            raise PetmodelError(f"There is no run {run_id} in the store; pick another model.")
        return loaders.checkpoint(self.store.resolve_model(run_id))

    def generate(self, settings: GenerateSettings) -> Generated:
        """Names for ``settings`` (model, temperature, n, prefix, seed, new); same settings, same names."""
        from petmodel.config import GenerateConfig
        from petmodel.generate import generate

        if settings.model is None:
            raise PetmodelError("There is no trained model yet; train one on the Train page.")
        config = GenerateConfig(n=settings.n, temperature=settings.temperature, prefix=settings.prefix,
                                seed=settings.seed, new_only=settings.new_only, species=settings.species)
        return generate(self.checkpoint(settings.model), config)

    def score(self, run_id: str, names: list[str], species: str = "any") -> list[NameScore]:
        """How pet-like ``names`` are under a run's model, ranked against its data's validation names
        (no percentile when that data file is gone); the reference is scored once per model."""
        from petmodel.score import cached_scorer

        ckpt = self.checkpoint(run_id)
        try:
            corpus = self.corpus(ckpt.meta.get("data_source"))
        except PetmodelError:
            corpus = None
        return cached_scorer(ckpt, corpus if corpus is not None and corpus.alphabet == ckpt.alphabet else None
                             ).score(names, species)


def available_models(store: RunStore) -> list[RunRecord]:
    """Completed runs of ``store`` whose model file is still on disk, best validation NLL first."""
    def has_file(run: RunRecord) -> bool:
        path = Path(run.model_path).expanduser()
        return (path if path.is_absolute() else store.root / path).is_file()

    def rank(run: RunRecord) -> tuple[float, float]:
        nll = run.nll
        return (float(nll) if nll is not None and math.isfinite(nll) else math.inf, -run.created)

    return sorted((r for r in store.list_runs(status="completed") if r.model_path and has_file(r)), key=rank)


def shutdown_all() -> None:
    """Close every backend of this process (their runs, clusters and clients); for tests and exit."""
    with _backends_lock:
        backends = list(_backends)
    for backend in backends:
        backend.close()


atexit.register(shutdown_all)  # the app server exits: cancel its runs and stop its local cluster
