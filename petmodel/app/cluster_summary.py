"""The cluster at a glance, as every page shows it: one frozen value instead of a dict read by string keys.

:meth:`petmodel.app.backend.AppBackend.summary` makes it (cached for a second or two: every page
reads it on every rerun) and never raises: a scheduler that vanished is ``connected=False`` with
``error`` saying so in one sentence. Pages read its fields; a misspelt one is an ``AttributeError``
at once, where a misspelt key read with ``.get`` was a silent ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ClusterKind(StrEnum):
    """Where the app's cluster came from."""

    LOCAL = "local"  # the embedded LocalCluster this app started
    REMOTE = "remote"  # a scheduler address or file
    GATEWAY = "gateway"  # a Dask Gateway cluster


@dataclass(frozen=True)
class ClusterSummary:
    """What the status line, the Home, Cluster, Train and Experiments pages show of the cluster."""

    connected: bool = False
    kind: ClusterKind | None = None
    scheduler: str | None = None  # its address (shown to admins)
    workers: int = 0
    threads: int = 0
    gpus: int = 0
    dashboard: str | None = None  # the Dask dashboard's link
    error: str | None = None  # one sentence, when the scheduler stopped answering
    versions: list[dict[str, Any]] | None = None  # each host's packages (a remote connect's check)
    code_hash: str | None = None  # the petmodel code shipped at connect
    scaling: dict[str, Any] | None = None  # the scaler's description, for a cluster that can grow
    gateway_cluster: str | None = None  # its name on the gateway

    @property
    def running(self) -> bool:
        """Connected and answering: what a launch needs."""
        return self.connected and not self.error
