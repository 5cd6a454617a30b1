"""Rank 0's training snapshots, from the run's Dask queue into the run store.

Workers share no disk with the client, so rank 0 posts each snapshot to a Dask ``Queue`` named after
the run (:class:`~petmodel.cluster.ranks._SnapshotSender`). The supervisor calls :meth:`collect` every
second or so: only the newest posted snapshot is written (older ones are superseded), atomically, by
:func:`petmodel.runner.save_snapshot_quietly`. The newest is also kept in memory, because a run that
re-forms starts its ranks from it even when the disk refused it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import distributed
from distributed import Client

from petmodel.cluster.calls import CALL_TIMEOUT_S
from petmodel.config import RunSpec
from petmodel.runner import save_snapshot_quietly
from petmodel.store import RunStore


@dataclass
class SnapshotCollector:
    """Collects one run's snapshots; ``newest`` is ``{"step", "elapsed", "blob"}`` or ``None``."""

    store: RunStore
    run_id: str
    spec: RunSpec
    queue_name: str
    newest: dict[str, Any] | None = None  # a resumed run starts with the snapshot it continues
    _queue: distributed.Queue | None = field(default=None, init=False, repr=False)

    def open(self, client: Client) -> None:
        """Attach to the run's queue (on the scheduler); call before :meth:`collect`."""
        self._queue = distributed.Queue(self.queue_name, client=client)

    def collect(self) -> None:
        """Write the newest snapshot posted since the last call, unless an older step than the one kept."""
        if self._queue is None:
            return
        posted = self._queue.get(batch=True, callback_timeout=CALL_TIMEOUT_S)
        if not posted:
            return
        newest = max(posted, key=lambda p: p["step"])
        if self.newest is None or newest["step"] >= self.newest["step"]:
            save_snapshot_quietly(self.store, self.run_id, self.spec, newest["blob"])
            self.newest = newest  # kept in memory for a re-form even when the disk refused it

    def close(self) -> None:
        """Collect what is left, then drop the queue; never raises (it runs while the run ends)."""
        if self._queue is None:
            return
        with contextlib.suppress(Exception):
            self.collect()
        with contextlib.suppress(Exception):
            self._queue.close()
        self._queue = None
