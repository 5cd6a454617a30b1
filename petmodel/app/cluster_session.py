"""The app's one Dask cluster: start the embedded one or connect to a scheduler, warm it up, let it go.

:class:`ClusterSession` is the part of :class:`petmodel.app.backend.AppBackend` that owns the
client, kept apart so the backend reads as runs, studies and models. One session holds at most one
cluster for the whole server process: a second Start or Connect is refused in one sentence rather
than silently orphaning the runs on the first. Launches queued for busy workers
(:class:`petmodel.app.pending.LaunchQueue`) live here too, because they must not outlive their
cluster: disconnecting cancels them before the client closes.

A cluster that can scale (the embedded one, a Dask Gateway cluster) gets a
:class:`petmodel.cluster.scaling.ClusterScaler`: launches ask it for the workers they need, the
Cluster page's "scale to N" sets its size. A Dask Gateway login (:mod:`petmodel.cluster.gateway`)
lives here too, so the page can list, create, connect to and shut down the user's clusters.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from petmodel.app import loaders
from petmodel.app.cluster_summary import ClusterKind, ClusterSummary
from petmodel.app.forms import default_data_path
from petmodel.app.gateway_session import GatewaySession
from petmodel.app.pending import LaunchQueue
from petmodel.app.tables import worker_rows
from petmodel.app.warmup import WARMUP_TIMEOUT_S, warm_cluster, warmup_enabled
from petmodel.cluster import registry
from petmodel.compat import scheduler_address
from petmodel.errors import PetmodelError, UsageError

if TYPE_CHECKING:
    from collections.abc import Callable

    from distributed import Client

    from petmodel.cluster.gateway import GatewayClient
    from petmodel.cluster.scaling import ClusterScaler
    from petmodel.studies.sizing import LocalStudyCluster

WORKERS_TIMEOUT_S = 3.0  # the Cluster page's worker table waits at most this long for the scheduler


class ClusterSession(GatewaySession):
    """The Dask client this process uses (None until started or connected); safe to share across threads.

    ``warmup``: warm a new cluster up with a tiny DDP run (default: ``$PETMODEL_WARMUP``, on
    unless set to 0); tests turn it off.
    """

    connect_timeout_s = 10.0  # how long Connect waits for an unreachable scheduler (Dask retries meanwhile)

    def __init__(self, *, warmup: bool | None = None) -> None:
        self.warmup = warmup_enabled() if warmup is None else warmup
        self._lock = threading.RLock()
        self._client: Client | None = None
        self._kind: ClusterKind | None = None  # LOCAL: we own the cluster
        self._address: str | None = None
        self._summary: tuple[float, ClusterSummary] | None = None  # the backend's cached summary()
        self._warm_thread: threading.Thread | None = None
        self._launches = LaunchQueue()  # launches waiting for busy workers, found again by id after a rerun
        self._gateway: GatewayClient | None = None  # the Dask Gateway this app is logged in to
        self._gateway_cluster: str | None = None  # the name of the gateway cluster connected, if any
        self._max_workers: int | None = None  # the most workers launches may grow this cluster to (None: default)

    @property
    def client(self) -> Client | None:
        return self._client

    @property
    def kind(self) -> ClusterKind | None:
        """"local" (the embedded cluster this app owns), "remote" (a scheduler), "gateway" (a gateway's), or None."""
        return self._kind

    @property
    def connected(self) -> bool:
        return self._client is not None

    def _adopt(self, client: Client, kind: ClusterKind, threads: int = 1) -> None:
        """Make ``client`` the current one (the caller holds the lock) and warm it up if asked to.

        The embedded cluster gets a scaler here (a gateway cluster's comes with its client); its
        floor is the size it started with.
        """
        self._client, self._kind, self._address = client, kind, scheduler_address(client)
        self._summary = None
        if kind == ClusterKind.LOCAL:
            self._attach_local_scaler(client, threads)
        if self.warmup:
            self._warm_async(client)

    def _refuse_second_cluster(self) -> None:
        if self._client is not None:
            where = "the local cluster" if self._kind == ClusterKind.LOCAL else self._address
            raise PetmodelError(f"Already using {where}; stop or disconnect it first.")

    def start_local(self, n_workers: int | None = None, threads: int | None = None) -> ClusterSummary:
        """Start the embedded local cluster (worker processes on this machine); returns summary()."""
        from petmodel.cluster.local import start_local_cluster

        with self._lock:
            self._refuse_second_cluster()
            self._adopt(start_local_cluster(n_workers, threads), ClusterKind.LOCAL, threads or 1)
        return self.summary()

    def connect(self, address: str, timeout: float | None = None, *, tls_ca_file: str | None = None,
                tls_cert: str | None = None, tls_key: str | None = None) -> ClusterSummary:
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
                        ClusterKind.REMOTE)
        return self.summary()

    def summary(self) -> ClusterSummary:
        """The cluster's status at a glance: :meth:`petmodel.app.backend.AppBackend.summary` (cached there)."""
        raise NotImplementedError

    def ensure_cluster(self, n_workers: int, threads: int = 1) -> Client:
        """The current client, starting the embedded local cluster with ``n_workers`` if there is none."""
        from petmodel.cluster.local import start_local_cluster

        return self._ensure(lambda: start_local_cluster(max(1, n_workers), max(1, threads)), max(1, threads))

    def ensure_study_cluster(self, local: LocalStudyCluster) -> Client:
        """The current client, else the embedded cluster ``local`` describes (a study's: sized and tuned
        for timing exactly as the CLI's, see :mod:`petmodel.studies.sizing`)."""
        return self._ensure(local.start)

    def _ensure(self, start: Callable[[], Client], threads: int = 1) -> Client:
        with self._lock:
            if self._client is None:
                self._adopt(start(), ClusterKind.LOCAL, threads)
            assert self._client is not None
            return self._client

    def disconnect(self, *, wait_s: float = 20.0) -> None:
        """Cancel the runs on this cluster, then close the client (and the local cluster it owns)."""
        from petmodel.cluster.connect import shutdown

        with self._lock:
            client, self._client, self._kind, self._address = self._client, None, None, None
            self._summary, self._gateway_cluster, self._max_workers = None, None, None
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
        """Stop everything this session started (for tests and server shutdown); never raises."""
        try:
            self.disconnect(wait_s=10.0)
        except Exception:  # noqa: BLE001 - teardown must not raise
            pass
        self.gateway_logout()  # petmodel.app.gateway_session

    def _warm_async(self, client: Client) -> None:
        """Warm the new cluster up in the background (see :mod:`petmodel.app.warmup`); launches wait for it."""
        data = default_data_path()
        thread = threading.Thread(target=warm_cluster, args=(client,),
                                  kwargs={"then": (lambda: loaders.corpus(data)) if data else None},
                                  name="petmodel-app-warm", daemon=True)
        self._warm_thread = thread
        thread.start()

    def wait_warm(self, timeout: float = WARMUP_TIMEOUT_S) -> None:
        """Block until the background warm-up (if any) is over, at most ``timeout`` seconds."""
        thread = self._warm_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def workers(self) -> list[dict[str, Any]]:
        """The cluster's workers as table rows (empty when not connected); PetmodelError if unreachable."""
        client = self._client
        if client is None:
            return []
        from petmodel.cluster.reservations import snapshot
        from petmodel.cluster.workers import describe_workers

        try:
            infos = describe_workers(client, timeout=WORKERS_TIMEOUT_S)
        except PetmodelError:
            raise
        except Exception as err:  # noqa: BLE001
            raise PetmodelError(f"Could not list the workers ({type(err).__name__}); reconnect or restart "
                                "the cluster.") from err
        busy = registry.busy_workers()
        try:  # workers held by any client of the cluster, not only this app's runs
            busy |= set(snapshot(client)["held"])
        except Exception:  # noqa: BLE001 - this process's own runs are still shown
            pass
        return worker_rows(infos, busy)

    # ---- scaling ----------------------------------------------------------------------------------
    def _scaling_config(self, n_workers: int) -> Any:
        """The scaling settings for a new cluster: the page's maximum, else ``$PETMODEL_SCALE_MAX_WORKERS``.

        Without either, the embedded cluster may not grow past the size it started with (it was sized to
        this machine's cores, and more ranks would share them): the Cluster page raises it.
        """
        import os

        from petmodel.config import SCALE_MAX_WORKERS_ENV, ScalingConfig

        config = ScalingConfig.from_env()
        most = self._max_workers
        if most is None and self._kind == ClusterKind.LOCAL and not os.environ.get(SCALE_MAX_WORKERS_ENV, "").strip():
            most = max(1, n_workers)
        if most is None:
            return config
        return ScalingConfig(max_workers=most, grace_s=config.grace_s, join_timeout_s=config.join_timeout_s)

    @staticmethod
    def scaling_problem() -> str | None:
        """A malformed ``$PETMODEL_SCALE_*`` setting, in one sentence (None when they read well).

        Attaching a scaler must not fail a cluster's start, so its error is swallowed there; the Cluster
        page asks here instead, so the operator learns why the cluster does not grow for a launch.
        """
        from petmodel.config import ScalingConfig
        from petmodel.errors import UsageError

        try:
            ScalingConfig.from_env()
        except UsageError as err:
            return str(err)
        return None

    def _attach_local_scaler(self, client: Client, threads: int) -> None:
        from petmodel.cluster.local import local_scaler
        from petmodel.cluster.workers import describe_workers

        try:
            n = len(describe_workers(client, probe_gpus=False))
            local_scaler(client, self._scaling_config(n), threads_per_worker=threads, floor=n)
        except Exception:  # noqa: BLE001 - a cluster that cannot scale still trains on what it has
            pass

    def scaler(self) -> ClusterScaler | None:
        """The connected cluster's scaler (None when it cannot scale, e.g. a bare scheduler address)."""
        from petmodel.cluster.scaling import scaler_of

        return scaler_of(self._client)

    def scale_to(self, n: int) -> str:
        """Make the connected cluster ``n`` workers large (the page's "scale to N"); what was done, in a sentence.

        Workers runs hold are never taken away: the cluster then shrinks as those runs end.
        """
        from petmodel.settings import require_whole

        n = require_whole("The number of workers", n, minimum=0, maximum=10_000)
        scaler = self.scaler()
        if scaler is None:
            raise PetmodelError("This cluster cannot be scaled from here: add or stop its workers where it runs.")
        if self._kind == ClusterKind.LOCAL:
            from petmodel.cluster.local import check_local_shape

            check_local_shape(max(1, n))
        text = scaler.scale_to(n)
        if n > scaler.max_workers:  # the user's own size is also what launches may grow it to
            scaler.configure(max_workers=n)
        self._summary = None
        return text

    def set_max_workers(self, n: int) -> None:
        """The most workers a launch may grow the connected cluster to (until it is disconnected)."""
        from petmodel.config import ScalingConfig

        ScalingConfig(max_workers=n)  # checks it, in one sentence
        self._max_workers = int(n)
        scaler = self.scaler()
        if scaler is not None:
            scaler.configure(max_workers=int(n))
        self._summary = None
