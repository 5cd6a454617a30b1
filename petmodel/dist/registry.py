"""The one registry of runs this process is driving: run id → handle, and the workers they hold."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from petmodel.dist.launch import RunHandle

_runs: dict[str, RunHandle] = {}
_lock = threading.Lock()


def register(handle: RunHandle) -> None:
    with _lock:
        _runs[handle.run_id] = handle


def unregister(run_id: str) -> None:
    with _lock:
        _runs.pop(run_id, None)


def get_run(run_id: str) -> RunHandle | None:
    """The handle of a run this process drives, or ``None`` (finished, or driven elsewhere)."""
    with _lock:
        return _runs.get(run_id)


def live_runs() -> list[RunHandle]:
    """Runs this process drives that have not ended yet."""
    with _lock:
        return [h for h in _runs.values() if not h.done()]


def busy_workers() -> set[str]:
    """Workers reserved by runs this process is driving."""
    return {w for h in live_runs() for w in h.worker_addresses}
