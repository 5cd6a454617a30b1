"""The Train page's "End worker" control for each rank of a running run, so a user can watch it recover.

The page is for the owner and admins only (``pages/_ui.require_admin``), so this control is too. It
ends the worker process the way :mod:`petmodel.cluster.worker_kill` explains (as a crash would),
through the app's own client: the run then re-forms on the rest, with its restart marked on the
charts, or fails naming the worker when it has no restarts left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from petmodel.errors import PetmodelError
from petmodel.status import RunStatus

if TYPE_CHECKING:
    from petmodel.app.backend import AppBackend
    from petmodel.store import RunRecord


def killable_ranks(be: AppBackend, run: RunRecord) -> list[int]:
    """The ranks whose worker the page offers to end: every rank of a running multi-worker run on the cluster
    this app is connected to; none otherwise."""
    workers = [w for w in run.workers if w != "local"]
    if run.status != RunStatus.RUNNING or len(workers) < 2 or run.backend == "local" or be.client is None:
        return []
    return list(range(len(workers)))


def end_rank_worker(be: AppBackend, run_id: str, rank: int) -> tuple[bool, str]:
    """End the worker of ``rank``: (whether it was told to, one sentence for the page)."""
    from petmodel.cluster.worker_kill import kill_rank

    if be.client is None:
        return False, "No cluster is connected to this app, so it cannot reach the run's workers."
    try:
        killed = kill_rank(be.client, be.store, run_id, rank)
    except PetmodelError as err:
        return False, str(err)
    return True, killed.sentence()
