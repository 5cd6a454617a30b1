"""The app's Dask Gateway login: list, create, connect to and shut down the user's gateway clusters.

The part of :class:`petmodel.app.cluster_session.ClusterSession` (which mixes it in) that talks to a
gateway (:mod:`petmodel.cluster.gateway`); a gateway cluster, once connected, is the session's one
cluster like any other (its scaler comes with its client, :func:`petmodel.cluster.connect.connect_cluster`).
One login per app server; a wrong password or an unreachable gateway is one sentence.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from petmodel.app.cluster_summary import ClusterKind, ClusterSummary
from petmodel.errors import UsageError

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.cluster.gateway import GatewayClient, GatewayClusterInfo, OptionField


class GatewaySession:
    """Gateway login and clusters; mixed into ClusterSession, whose lock, client and ``_adopt`` it uses."""

    _lock: threading.RLock
    _client: Client | None
    _kind: ClusterKind | None
    _gateway: GatewayClient | None
    _gateway_cluster: str | None
    connect_timeout_s: float

    if TYPE_CHECKING:  # provided by ClusterSession
        def _refuse_second_cluster(self) -> None: ...
        def _adopt(self, client: Client, kind: ClusterKind, threads: int = 1) -> None: ...
        def _scaling_config(self, n_workers: int) -> Any: ...
        def summary(self) -> ClusterSummary: ...
        def scale_to(self, n: int) -> str: ...
        def disconnect(self, *, wait_s: float = 20.0) -> None: ...

    @property
    def gateway(self) -> GatewayClient | None:
        """The gateway this app is logged in to, if any."""
        return self._gateway

    @property
    def gateway_cluster(self) -> str | None:
        """The name of the gateway cluster connected, if any."""
        return self._gateway_cluster if self._kind == ClusterKind.GATEWAY else None

    def _require_gateway(self) -> GatewayClient:
        if self._gateway is None:
            raise UsageError("Log in to a Dask Gateway first.")
        return self._gateway

    def gateway_login(self, address: str | None, username: str | None = None,
                      password: str | None = None) -> list[GatewayClusterInfo]:
        """Log in to the gateway at ``address`` (None: Dask's config), replacing any earlier login; the
        user's clusters there. One sentence for a wrong password or an unreachable gateway."""
        from petmodel.cluster.gateway import open_gateway

        gateway = open_gateway(address or None, username=username or None, password=password or None)
        with self._lock:
            old, self._gateway = self._gateway, gateway
        if old is not None:
            old.close()
        return gateway.clusters()

    def gateway_logout(self) -> None:
        """Forget the gateway login (a cluster connected from it stays connected); never raises."""
        with self._lock:
            gateway, self._gateway = self._gateway, None
        if gateway is not None:
            gateway.close()

    def gateway_clusters(self) -> list[GatewayClusterInfo]:
        """The user's pending and running clusters on the gateway, newest first."""
        return self._require_gateway().clusters()

    def gateway_options(self) -> list[OptionField]:
        """The cluster options the gateway offers for a new cluster (often none)."""
        return self._require_gateway().options()

    def gateway_create(self, options: dict[str, Any] | None = None, workers: int = 0) -> ClusterSummary:
        """Create a cluster on the gateway (with these options), connect to it and scale it to ``workers``.

        The cluster outlives a Disconnect; :meth:`gateway_stop` shuts it down.
        """
        from petmodel.settings import require_whole

        workers = require_whole("The number of workers", workers, minimum=0, maximum=10_000)
        gateway = self._require_gateway()
        with self._lock:
            self._refuse_second_cluster()
        cluster = gateway.create(options or None, shutdown_on_close=False)
        try:
            summary = self._adopt_gateway(cluster, floor=workers)
        except BaseException:
            gateway.stop(cluster.name, quiet=True)
            raise
        if workers:
            self.scale_to(workers)
        return summary

    def gateway_connect(self, name: str) -> ClusterSummary:
        """Connect to the user's gateway cluster ``name`` (versions checked, this code shipped); summary()."""
        gateway = self._require_gateway()
        with self._lock:
            self._refuse_second_cluster()
        return self._adopt_gateway(gateway.attach(name, shutdown_on_close=False))

    def _adopt_gateway(self, cluster: Any, floor: int | None = None) -> ClusterSummary:
        from petmodel.cluster.connect import connect_cluster

        client = connect_cluster(cluster, timeout=self.connect_timeout_s, own=True,
                                 scaling=self._scaling_config(0), floor=floor)
        with self._lock:
            if self._client is not None:  # another session connected meanwhile: keep theirs
                from petmodel.cluster.connect import shutdown

                shutdown(client)
                self._refuse_second_cluster()
            self._adopt(client, ClusterKind.GATEWAY)
            self._gateway_cluster = cluster.name
        return self.summary()

    def gateway_stop(self, name: str | None = None) -> None:
        """Shut the gateway cluster ``name`` down (default: the connected one, disconnected first)."""
        gateway = self._require_gateway()
        name = name or self.gateway_cluster
        if not name:
            raise UsageError("Pick one of your gateway clusters.")
        if name == self.gateway_cluster:
            self.disconnect()
        gateway.stop(name)
