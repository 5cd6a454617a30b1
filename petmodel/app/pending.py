"""Launches from the app that wait for busy workers: each in a background thread the page polls.

A launch onto workers held by another run (another browser tab, the CLI, another app server)
waits in the scheduler's first-come-first-served queue (:mod:`petmodel.cluster.reservations`). A
Streamlit script must not block for that long, so :class:`LaunchQueue` runs each launch in a
thread of its own and keeps a :class:`PendingLaunch` the page finds again by id after every
rerun (the id lives in ``st.session_state``; the queue lives in the shared ``AppBackend``).
A page reads :meth:`PendingLaunch.status`, an immutable :class:`LaunchStatus`, so it never sees
a half-updated state.

Nothing here imports Streamlit or knows how a run starts: the caller hands in a ``start``
function that takes ``on_queue`` and ``cancel`` (as :func:`petmodel.cluster.launch.launch_run` does).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from petmodel.errors import LaunchCancelled, PetmodelError

__all__ = ["CANCELLED", "LaunchQueue", "LaunchStatus", "PendingLaunch", "StartFn", "waiting_text"]

SETTLE_S = 120.0  # a page waits (under a spinner) this long for a launch to start or join the queue
KEEP_S = 600.0  # a finished launch stays findable this long (a page that polls late still learns how it ended)
CANCELLED = "The launch was cancelled while it waited for free workers."  # LaunchCancelled's sentence


class LaunchState(StrEnum):
    """Where a launch stands (a ``StrEnum``: each member is its text, so pages compare members, never strings)."""

    STARTING = "starting"  # checking the request, starting the cluster
    GROWING = "growing"  # asked a scalable cluster for workers, waiting for them to join
    QUEUED = "queued"  # waiting in the scheduler's queue for busy workers
    STARTED = "started"  # the run is on: ``run_id``
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (LaunchState.STARTED, LaunchState.FAILED, LaunchState.CANCELLED)


# ``start(on_queue, cancel, on_scale)`` launches and returns the new run's id; it raises PetmodelError
# (LaunchCancelled when ``cancel`` ended its wait). ``on_scale(sentence)``: it asked the cluster for workers.
StartFn = Callable[[Callable[[int, list[str]], None], threading.Event, Callable[[str], None]], str]


@dataclass(frozen=True)
class LaunchStatus:
    """Where one launch stands, as a page shows it.

    ``state``: starting (checking the request, starting the cluster), growing (it asked a scalable
    cluster for more workers and waits for them to join: ``scaling`` says so), queued (``position`` in
    the scheduler's queue, ``busy`` the workers it waits for), started (``run_id``), failed or
    cancelled (``error``, one sentence).
    """

    state: LaunchState = LaunchState.STARTING
    scaling: str | None = None
    position: int | None = None
    busy: tuple[str, ...] = ()
    run_id: str | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        """Whether the launch is over (started, failed or cancelled): nothing will change any more."""
        return self.state.finished


@dataclass
class PendingLaunch:
    """One launch running in its own thread; ``id`` is what a page keeps to find it again."""

    id: str
    label: str
    created: float = field(default_factory=time.monotonic)
    _status: LaunchStatus = field(default_factory=LaunchStatus, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _changed: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _finished_at: float | None = field(default=None, repr=False)

    def status(self) -> LaunchStatus:
        return self._status

    @property
    def elapsed_s(self) -> float:
        """Seconds since the launch was asked for (how long it has waited so far, while queued)."""
        return time.monotonic() - self.created

    def cancel(self) -> bool:
        """Stop waiting for workers; False when the launch is already over (a run it started is not touched).

        The wait ends within the queue's poll interval. A launch that is granted its workers in
        that same moment still starts its run: the page then shows that run, which has its own Cancel.
        """
        if self._status.finished:
            return False
        self._cancel.set()
        return True

    def wait(self, timeout: float | None = None, *, settled: bool = False) -> LaunchStatus:
        """Wait up to ``timeout`` s until the launch is over, or (``settled``) at least queued; its status.

        ``settled`` is how a page keeps today's behaviour for free workers: it waits (under a
        spinner) while the launch starts, and stops waiting as soon as the launch joins the queue.
        """
        def ready() -> bool:
            waiting = self._status.state in (LaunchState.QUEUED, LaunchState.GROWING)
            return self._status.finished or (settled and waiting)

        with self._changed:
            self._changed.wait_for(ready, timeout)
        return self._status

    def _set(self, **changes: object) -> None:
        with self._changed:
            self._status = replace(self._status, **changes)  # type: ignore[arg-type]
            if self._status.finished and self._finished_at is None:
                self._finished_at = time.monotonic()
            self._changed.notify_all()

    def _queued(self, position: int, busy: list[str]) -> None:
        """``on_queue`` for :func:`petmodel.cluster.reservations.reserve`: called when the place changes."""
        self._set(state=LaunchState.QUEUED, position=int(position), busy=tuple(busy))

    def _growing(self, sentence: str) -> None:
        """``on_scale`` for :meth:`petmodel.cluster.scaling.ClusterScaler.providing`: what it asked the cluster for."""
        self._set(state=LaunchState.GROWING, scaling=str(sentence))

    def _run(self, start: StartFn) -> None:
        try:
            if self._cancel.is_set():  # cancelled before it got anywhere (a disconnect, say)
                raise LaunchCancelled(CANCELLED)
            run_id = start(self._queued, self._cancel, self._growing)
        except PetmodelError as err:
            # The type, not the wording, says the wait was cancelled (reservations.reserve raises it).
            cancelled = self._cancel.is_set() and isinstance(err, LaunchCancelled)
            self._set(state=LaunchState.CANCELLED if cancelled else LaunchState.FAILED, error=str(err))
        except Exception as err:  # noqa: BLE001 - a bug must still end the launch with a sentence, not hang the page
            self._set(state=LaunchState.FAILED, error=f"The launch failed unexpectedly ({type(err).__name__}: {err}); "
                                            "check the Cluster page and try again.")
        else:
            self._set(state=LaunchState.STARTED, run_id=run_id)


def waiting_text(status: LaunchStatus) -> str:
    """The one line a page shows for a launch that is not over yet."""
    if status.state is LaunchState.GROWING:
        return status.scaling or "Waiting for the cluster to add workers…"
    if status.state is not LaunchState.QUEUED:
        return "Starting the launch: checking the data and the cluster…"
    why = f"busy: {', '.join(status.busy)}" if status.busy else "launches ahead of it go first"
    return f"Waiting for free workers: number {status.position} in the queue ({why})."


class LaunchQueue:
    """This process's pending launches, by id; safe to share across sessions and threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, PendingLaunch] = {}

    def submit(self, start: StartFn, label: str = "launch") -> PendingLaunch:
        """Run ``start`` in a background thread now; the :class:`PendingLaunch` that tracks it."""
        pending = PendingLaunch(id=f"launch-{uuid.uuid4().hex[:12]}", label=label)
        thread = threading.Thread(target=pending._run, args=(start,), name=f"petmodel-app-{pending.id}", daemon=True)
        with self._lock:
            self._prune()
            self._items[pending.id] = pending
        thread.start()
        return pending

    def get(self, launch_id: object) -> PendingLaunch | None:
        """The launch with ``launch_id`` (None when unknown, or finished more than KEEP_S ago)."""
        if not isinstance(launch_id, str):
            return None
        with self._lock:
            self._prune()
            return self._items.get(launch_id)

    def waiting(self) -> list[PendingLaunch]:
        """The launches not yet over, oldest first."""
        with self._lock:
            return sorted((p for p in self._items.values() if not p.status().finished), key=lambda p: p.created)

    def cancel_all(self, wait_s: float = 5.0) -> None:
        """Cancel every launch still waiting and give their threads ``wait_s`` to end (a disconnect)."""
        waiting = self.waiting()
        for pending in waiting:
            pending.cancel()
        deadline = time.monotonic() + wait_s
        for pending in waiting:
            pending.wait(max(0.0, deadline - time.monotonic()))

    def _prune(self) -> None:
        now = time.monotonic()
        for key in [k for k, p in self._items.items() if p._finished_at is not None and now - p._finished_at > KEEP_S]:
            del self._items[key]
