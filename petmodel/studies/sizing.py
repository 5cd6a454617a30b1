"""The embedded cluster a study starts when none is connected: one rule for the CLI and the app.

A study's figures (time to target, speedup) are only comparable when the cluster they ran on is
the same, so ``python -m petmodel sweep``/``search`` and the Experiments page both size their
local cluster here (:func:`local_study_cluster`) and start it with the same timing settings
(:data:`petmodel.cluster.tuning.TIMING_CLUSTER_CONFIG`: quiet workers, no profiler). Importing this
module imports neither torch nor distributed: the sizing needs only the CPU count, and the cluster
modules load when a cluster starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from petmodel.studies.plan import SweepConfig
from petmodel.studies.search_config import SearchConfig

if TYPE_CHECKING:
    from distributed import Client

LOCAL_SEARCH_WORKERS = 2  # an embedded cluster for a search: enough for two trials at once


@dataclass(frozen=True)
class LocalStudyCluster:
    """The shape of a study's embedded cluster, and why it is smaller than asked (``note``, or None)."""

    n_workers: int
    threads_per_worker: int = 1
    note: str | None = None

    def start(self) -> Client:
        """Start it: worker processes on this machine, tuned for timing; the client owns the cluster."""
        from petmodel.cluster.local import start_local_cluster
        from petmodel.cluster.tuning import TIMING_CLUSTER_CONFIG

        return start_local_cluster(self.n_workers, self.threads_per_worker, config=TIMING_CLUSTER_CONFIG)


def local_study_cluster(config: SweepConfig | SearchConfig | None = None, *, threads_per_worker: int = 1,
                        cluster_workers: int | None = None) -> LocalStudyCluster:
    """The embedded cluster to start for ``config``.

    A sweep gets its largest worker count, clipped to the workers this machine's cores hold
    without sharing (a shared core would time the sharing, not the scaling); ``None`` gives that
    largest shape, what a form offers before a grid is typed. A search gets ``cluster_workers``
    (default :data:`LOCAL_SEARCH_WORKERS`), never fewer than one trial needs.
    """
    from petmodel.cluster.local import local_capacity

    threads = max(1, int(threads_per_worker))
    capacity = local_capacity(threads)
    if isinstance(config, SearchConfig):
        return LocalStudyCluster(max(cluster_workers or LOCAL_SEARCH_WORKERS, config.workers_per_trial), threads)
    if config is None:
        return LocalStudyCluster(capacity, threads)
    wanted = max(config.workers)
    if wanted <= capacity:
        return LocalStudyCluster(wanted, threads)
    return LocalStudyCluster(capacity, threads, note=f"This machine has {os.cpu_count()} CPU cores, so the local "
                                                     f"cluster gets {capacity} workers.")
