"""A study running in the background (:class:`StudyHandle`) and the registry of those this process drives.

The sweep and search drivers run their loop in the handle's thread and use its driver methods
(``run_in_background``, ``track_run``, ``save_progress``, …); callers use ``status``,
``progress()``, ``join()``, ``wait()`` and ``cancel()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from petmodel.errors import PetmodelError
from petmodel.status import RunStatus

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.cluster.launch import RunHandle
    from petmodel.store import RunStore

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often a driver looks at its runs
WAIT_FOR_WORKERS_S = 600.0  # how long a study waits for other runs to free the workers it needs

_studies: dict[str, StudyHandle] = {}
_studies_lock = threading.Lock()


def worker_counts(client: Client) -> tuple[int, int]:
    """(workers in the cluster, those not held by a run this process drives)."""
    # Imported here: ``import petmodel.studies`` stays free of distributed, so the CLI's parser is quick.
    from petmodel.cluster.registry import busy_workers
    from petmodel.cluster.workers import describe_workers

    workers = describe_workers(client, probe_gpus=False)
    busy = busy_workers()
    return len(workers), sum(1 for w in workers if w.address not in busy)


class StudyHandle:
    """A study running in a background thread: ``status``, ``progress()``, ``join()``, ``wait()``, ``cancel()``."""

    def __init__(self, study_id: str, kind: str, store: RunStore, client: Client) -> None:
        self.study_id = study_id
        self.kind = kind
        self.store = store
        self.client = client
        self.status: RunStatus = RunStatus.RUNNING
        self.error: str | None = None
        self.result: dict[str, Any] | None = None
        self.messages: list[str] = []
        self.warnings: list[str] = []
        self.items: list[dict[str, Any]] = []  # sweep points or search trials, with live status
        self.runs: dict[str, RunHandle] = {}  # run id → handle, for runs still going
        self.lock = threading.RLock()  # guards items and runs, which the driver and viewers share
        self._cancel = threading.Event()
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"StudyHandle({self.kind} {self.study_id}, {self.status})"

    # ---- for callers
    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def done(self) -> bool:
        return self._finished.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the study to end; whether it has ended."""
        return self._finished.wait(timeout)

    def cancel(self) -> None:
        """Stop the study: cancel its running runs, start no new ones; it ends ``cancelled`` within seconds."""
        self._cancel.set()
        for h in self._run_handles():
            h.cancel(status=RunStatus.CANCELLED, reason="The study was cancelled.")

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the study ends; its result (PetmodelError if it failed)."""
        if not self.join(timeout):
            raise PetmodelError(f"Study {self.study_id} is still running after {timeout:.0f} s.")
        if self.status == RunStatus.FAILED:
            raise PetmodelError(self.error or f"Study {self.study_id} failed.")
        return self.result or {"study_id": self.study_id, "status": self.status}

    def progress(self) -> list[dict[str, Any]]:
        """A copy of the points (sweep) or trials (search) with their live status."""
        with self.lock:
            return [dict(item) for item in self.items]

    # ---- for the drivers (sweep, search)
    def run_in_background(self, body: Callable[[], dict[str, Any]]) -> None:
        """Register the study and run ``body`` (which returns the result) in a thread; the study row ends final."""
        with _studies_lock:
            _studies[self.study_id] = self
        self._thread = threading.Thread(target=self._main, args=(body,), name=f"petmodel-study-{self.study_id}",
                                        daemon=True)
        self._thread.start()

    def track_run(self, run: RunHandle) -> None:
        with self.lock:
            self.runs[run.run_id] = run

    def untrack_run(self, run_id: str) -> None:
        with self.lock:
            self.runs.pop(run_id, None)

    def note(self, message: str) -> None:
        """Add a message for the user (once)."""
        with self.lock:
            if message not in self.messages:
                self.messages.append(message)

    def save_progress(self, **extra: Any) -> None:
        """Write the live snapshot to the study row, so viewers in other processes see it."""
        try:
            self.store.update_study(self.study_id, result={**self._snapshot(), **extra})
        except PetmodelError:
            log.warning("could not save the progress of study %s", self.study_id, exc_info=True)

    def wait_for_free_workers(self, n: int, *, all_of_cluster: bool = False) -> bool:
        """Block until ``n`` workers (or the whole cluster) are free; False if the study was cancelled meanwhile."""
        deadline = time.monotonic() + WAIT_FOR_WORKERS_S
        said = False
        while not self.cancelled:
            total, free = worker_counts(self.client)
            if total < n:
                raise PetmodelError(f"The cluster has {total} workers but this study needs {n}; "
                                    "start more workers or shrink the study.")
            if free >= (total if all_of_cluster else n):
                return True
            if not said:
                said = True
                self.note(f"Waiting for {'the whole cluster' if all_of_cluster else f'{n} free workers'} "
                          "(other runs are training).")
            if time.monotonic() > deadline:
                raise PetmodelError(f"No {n} free workers for {WAIT_FOR_WORKERS_S:.0f} s; "
                                    "stop the other runs or use another cluster.")
            time.sleep(0.5)
        return False

    # ---- internals
    def _main(self, body: Callable[[], dict[str, Any]]) -> None:
        try:
            result = body()
            self.status = RunStatus.CANCELLED if self.cancelled else RunStatus.COMPLETED
            result["status"] = self.status
            self.result = result
            self.store.update_study(self.study_id, status=self.status, result=result,
                                    error="Cancelled by the user." if self.status == RunStatus.CANCELLED else None)
        except Exception as err:  # noqa: BLE001 - the study row must end in a final state
            log.exception("study %s failed", self.study_id)
            self._stop_runs()
            self.status = RunStatus.FAILED
            self.error = str(err) if isinstance(err, PetmodelError) else f"The study failed ({err!r})."
            try:
                self.store.update_study(self.study_id, status=self.status, error=self.error, result=self._snapshot())
            except Exception:  # noqa: BLE001
                log.exception("could not record the failure of study %s", self.study_id)
        finally:
            self._finished.set()

    def _run_handles(self) -> list[RunHandle]:
        with self.lock:
            return list(self.runs.values())

    def _stop_runs(self) -> None:
        handles = self._run_handles()
        for h in handles:
            try:
                h.cancel(status=RunStatus.CANCELLED, reason="The study stopped.")
            except Exception:  # noqa: BLE001
                pass
        for h in handles:
            h.join(30)

    def _snapshot(self) -> dict[str, Any]:
        """What the study row holds while it runs (progress for other processes' viewers)."""
        return {"study_id": self.study_id, "kind": self.kind, "status": self.status, "items": self.progress(),
                "messages": list(self.messages), "warnings": list(self.warnings)}


def get_study_handle(study_id: str) -> StudyHandle | None:
    """The live handle of a study this process started (None for others)."""
    with _studies_lock:
        return _studies.get(study_id)


def active_studies() -> list[StudyHandle]:
    """Studies this process drives that have not ended yet."""
    with _studies_lock:
        return [h for h in _studies.values() if not h.done()]
