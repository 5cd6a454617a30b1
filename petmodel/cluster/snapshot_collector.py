"""Rank 0's training snapshots, from the run's Dask queue into the run store.

Workers share no disk with the client, so rank 0 posts each snapshot to a Dask ``Queue`` named after
the run (:class:`~petmodel.cluster.ranks._SnapshotSender`). The supervisor calls :meth:`collect` every
second or so: only the newest posted snapshot is written (older ones are superseded), atomically, by
:func:`petmodel.runner.save_snapshot_quietly`. The newest is also kept in memory, because a run that
re-forms starts its ranks from it even when the disk refused it.

A snapshot is kept back until the store holds the metric rows up to its step (rank 0 sends them
first, but as events, which may be drained a tick later): a run killed with its client then resumes
from a step its curve reaches, and the resumed curve continues it without a gap.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
import distributed
from distributed import Client

from petmodel.cluster.calls import CALL_TIMEOUT_S
from petmodel.cluster.run_progress import Snapshot
from petmodel.compat import queue_get_within
from petmodel.config import RunSpec
from petmodel.runner import save_snapshot_quietly
from petmodel.store import RunStore

HOLD_MAX_S = 5.0  # the longest a snapshot waits for its metric rows


@dataclass
class SnapshotCollector:
    """Collects one run's snapshots; ``newest`` is the newest one written (or kept after the disk refused it)."""

    store: RunStore
    run_id: str
    spec: RunSpec
    queue_name: str
    newest: Snapshot | None = None  # a resumed run starts with the snapshot it continues
    _queue: distributed.Queue | None = field(default=None, init=False, repr=False)
    _held: Snapshot | None = field(default=None, init=False, repr=False)  # newer than the stored rows
    _held_since: float = field(default=0.0, init=False, repr=False)

    def open(self, client: Client) -> None:
        """Attach to the run's queue (on the scheduler); call before :meth:`collect`."""
        self._queue = distributed.Queue(self.queue_name, client=client)

    def collect(self, stored_step: int | None = None, *, timeout: float = CALL_TIMEOUT_S) -> None:
        """Write the newest snapshot posted so far, once the store's metric rows reach its step.

        ``stored_step``: the last step whose rows are in the store (None: write without waiting).
        A snapshot held back longer than :data:`HOLD_MAX_S` is written anyway: rows that never
        came must not cost the run its snapshot. ``timeout`` bounds the call to the scheduler
        (``TimeoutError`` past it: the caller decides whether a silence that long is fatal).
        """
        if self._queue is None:
            return
        posted = [Snapshot.posted(p) for p in queue_get_within(self._queue, timeout=timeout, batch=True) or []]
        if self._held is not None:
            posted.append(self._held)
        if not posted:
            return
        newest = max(posted, key=lambda p: p.step)
        if self.newest is not None and newest.step < self.newest.step:
            self._held = None
            return
        waited = time.monotonic() - self._held_since if self._held is newest else 0.0
        if stored_step is not None and newest.step > stored_step and waited < HOLD_MAX_S:
            if self._held is not newest:
                self._held, self._held_since = newest, time.monotonic()
            return
        self._held = None
        save_snapshot_quietly(self.store, self.run_id, self.spec, newest.blob)
        self.newest = newest  # kept in memory for a re-form even when the disk refused it

    def settle(self, stored_step: int) -> None:
        """Before a re-form: write what the stored rows reach, then forget a snapshot still held back
        (its rows are dropped with the formation; the run restarts from :attr:`newest`)."""
        with contextlib.suppress(Exception):
            self.collect(stored_step)
        self._held = None

    def close(self) -> None:
        """Collect what is left, then drop the queue; never raises (it runs while the run ends)."""
        if self._queue is None:
            return
        with contextlib.suppress(Exception):
            self.collect()
        with contextlib.suppress(Exception):
            self._queue.close()
        self._queue = None
