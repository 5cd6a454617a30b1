"""The one registry of runs this process is driving: run id → handle, and the workers they hold.

:func:`~petmodel.cluster.launch.launch_run` registers each run and its monitor unregisters it when
the run ends, so :func:`~petmodel.cluster.workers.choose_workers` never gives a busy worker to a
second run, and the app and the studies find a live run's handle by its id. It is per process:
runs driven by another process show only in the run store.

It knows a run only by the shape :class:`LiveRun` (a :class:`~petmodel.cluster.launch.RunHandle` has it),
so it imports nothing of the cluster package: :mod:`~petmodel.cluster.workers` asks it which workers are
busy, and :mod:`~petmodel.cluster.launch` registers here, without a cycle between them.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from distributed import Client


class LiveRun(Protocol):
    """What the registry and its readers need of a live run (the app casts back to ``RunHandle``)."""

    run_id: str
    client: Client
    store: Any  # a petmodel.store.RunStore

    @property
    def worker_addresses(self) -> list[str]: ...

    def done(self) -> bool: ...


_runs: dict[str, LiveRun] = {}
_lock = threading.Lock()


def register(handle: LiveRun) -> None:
    """Record ``handle`` as live under its run id (its workers count as busy from now)."""
    with _lock:
        _runs[handle.run_id] = handle


def unregister(run_id: str) -> None:
    """Forget a run (ended, or never started); unknown ids are fine."""
    with _lock:
        _runs.pop(run_id, None)


def get_run(run_id: str) -> LiveRun | None:
    """The handle of a run this process drives, or ``None`` (finished, or driven elsewhere)."""
    with _lock:
        return _runs.get(run_id)


def live_runs() -> list[LiveRun]:
    """Runs this process drives that have not ended yet."""
    with _lock:
        return [h for h in _runs.values() if not h.done()]


def busy_workers() -> set[str]:
    """Workers reserved by runs this process is driving."""
    return {w for h in live_runs() for w in h.worker_addresses}
