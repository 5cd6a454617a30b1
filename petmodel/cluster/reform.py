"""Re-forming a run that lost workers: the steps, kept apart from the supervisor that decides when.

When :func:`~petmodel.cluster.failure_policy.decide` says REFORM, :func:`reform` settles the newest
snapshot, keeps the surviving ranks' workers and tops them up with free ones
(:func:`~petmodel.cluster.reservations.reserve_free`). A free worker is a stranger to the run: it
may have joined after connect, so it must pass every check a launch applies
(:mod:`petmodel.cluster.worker_checks`) before the run takes it. One that fails is given back at
once, logged in one line naming it and why, and noted in the ``why`` of the lost workers it would
have replaced; the re-form tries another free worker, or goes on with fewer. Then the metrics past
the snapshot are trimmed, the run record updated and the new group formed.

The supervisor is seen here only through :class:`Reforming` (what a re-form reads and changes), so
this module imports neither :mod:`~petmodel.cluster.supervisor` nor :mod:`~petmodel.cluster.launch`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from petmodel.cluster import reservations, worker_checks
from petmodel.cluster.calls import CALL_TIMEOUT_S
from petmodel.cluster.workers import WorkerInfo, cpu_slots, ddp_backend, describe_workers

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.cluster.failure_policy import Decision
    from petmodel.cluster.snapshot_collector import SnapshotCollector
    from petmodel.cluster.worker_checks import Refusal
    from petmodel.config import RunSpec
    from petmodel.store import RunStore

log = logging.getLogger(__name__)


class ReformingRun(Protocol):
    """The fields of a :class:`~petmodel.cluster.launch.RunHandle` a re-form reads and updates."""

    run_id: str
    client: Client
    store: RunStore
    spec: RunSpec
    workers: list[WorkerInfo]
    backend: str
    restarts: int
    lost_workers: list[dict[str, Any]]

    @property
    def worker_addresses(self) -> list[str]: ...


class Reforming(Protocol):
    """What a re-form needs of the :class:`~petmodel.cluster.supervisor.Supervisor` driving the run."""

    snapshots: SnapshotCollector
    last_step: int
    rows: collections.deque[dict[str, Any]]  # metric rows not yet written: dropped, their steps train again
    extra_reservations: list[str]  # released with the run's own reservation when the run ends
    cancel_requested: threading.Event

    @property
    def run(self) -> ReformingRun: ...

    def form_group(self, slots: dict[str, tuple[int, int]]) -> None: ...


def reform(sup: Reforming, decision: Decision, *, grace_s: float) -> bool:
    """Restart the run from its newest snapshot on the workers it still has (plus free ones that pass).

    The global batch stays the same, so the run continues on the same trajectory (DDP is exact);
    metrics past the snapshot are dropped, as those steps are trained again. A run with no survivor
    waits up to ``grace_s`` for a free worker. False when no worker could be had or the new group
    could not start: the caller then fails the run with ``decision.sentence``.
    """
    run = sup.run
    sup.snapshots.settle(sup.last_step)
    survivors = [run.workers[r] for r in decision.survivors]
    refused: list[Refusal] = []
    survivors += _replacements(sup, len(run.workers) - len(survivors), refused,
                               wait_s=grace_s if not survivors else 0.0)
    if not survivors:
        return False
    step = sup.snapshots.newest["step"] if sup.snapshots.newest else 0
    why = _why(decision.sentence, refused)
    for r in decision.lost:
        run.lost_workers.append({"worker": run.workers[r].address, "rank": r, "step": step,
                                 "failed_step": max(sup.last_step, step), "at": time.time(), "why": why})
    run.restarts += 1
    log.warning("run %s lost %s; re-forming on %d worker(s) from step %d", run.run_id,
                ", ".join(run.workers[r].address for r in decision.lost), len(survivors), step)
    run.store.trim_metrics(run.run_id, step)
    sup.rows.clear()
    sup.last_step = step
    run.workers = sorted(survivors, key=lambda w: w.host)
    run.backend = ddp_backend(run.workers)  # a replacement may share a GPU the lost worker had alone
    run.store.update_run(run.run_id, restarts=run.restarts, lost_workers=run.lost_workers,
                         workers=run.worker_addresses, hosts=sorted({w.host for w in run.workers}))
    try:
        sup.form_group(cpu_slots(describe_workers(run.client, timeout=CALL_TIMEOUT_S, probe_gpus=False)))
    except Exception as err:  # noqa: BLE001 - reported as the run's failure by the caller
        log.warning("could not re-form run %s: %s", run.run_id, err)
        return False
    return True


def _replacements(sup: Reforming, want: int, refused: list[Refusal], *, wait_s: float) -> list[WorkerInfo]:
    """Up to ``want`` free workers that pass every launch check; the ones that fail join ``refused``.

    Each is reserved on its own key, so a refused one is given back alone; the kept keys join the
    supervisor's, released when the run ends. ``wait_s``: how long to keep looking for the first one.
    """
    run = sup.run
    deadline = time.monotonic() + wait_s
    taken: list[WorkerInfo] = []
    while len(taken) < want:
        exclude = [*run.worker_addresses, *(w.address for w in taken), *(r.worker for r in refused)]
        key, found = reservations.reserve_free(run.client, 1, exclude=exclude, cancel=sup.cancel_requested,
                                               wait_s=0.0 if taken else max(0.0, deadline - time.monotonic()))
        if key is None or not found:
            break
        sup.extra_reservations.append(key)  # before the checks: released with the run's, should one raise
        problems = worker_checks.refusals(run.client, [w.address for w in found],
                                          precision=run.spec.train.precision, timeout=CALL_TIMEOUT_S)
        if not problems:
            taken += found
            continue
        sup.extra_reservations.remove(key)
        reservations.release(run.client, key)
        for p in problems:
            log.warning("run %s: not re-forming on free worker %s, which fails the %s check a launch applies: %s",
                        run.run_id, p.worker, p.check, p.error)
        refused += problems
    return taken


def _why(sentence: str | None, refused: list[Refusal]) -> str | None:
    """The lost workers' ``why``: the decision's sentence, naming any free worker the re-form refused."""
    if not refused:
        return sentence
    notes = "; ".join(f"free worker {r.worker} was not taken ({r.reason})" for r in refused)
    return f"{(sentence or 'Workers were lost').rstrip('.')}; {notes}."
