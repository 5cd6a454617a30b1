"""Re-forming a run that lost workers: the steps, kept apart from the supervisor that decides when.

When :func:`~petmodel.cluster.failure_policy.decide` says REFORM, :func:`reform` settles the newest
snapshot, keeps the surviving ranks' workers and tops them up with free ones
(:func:`~petmodel.cluster.reservations.reserve_free`). A free worker is a stranger to the run: it
may have joined after connect, so it must pass every check a launch applies
(:mod:`petmodel.cluster.worker_checks`) before the run takes it. One that fails is given back at
once, logged in one line naming it and why, and noted in the ``why`` of the lost workers it would
have replaced; the re-form tries another free worker, or goes on with fewer. Then the metrics past
the snapshot are trimmed, the run record updated and the new group formed.

The supervisor is seen here only through :class:`Reforming` (what a re-form reads, and the
:class:`~petmodel.cluster.run_progress.RunProgress` it replaces through ``report``), so this module imports neither :mod:`~petmodel.cluster.supervisor` nor :mod:`~petmodel.cluster.launch`.
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
    from petmodel.cluster.failure_policy import Decision
    from petmodel.cluster.run_progress import RunProgress, SupervisedRun
    from petmodel.cluster.snapshot_collector import SnapshotCollector
    from petmodel.cluster.worker_checks import Refusal

log = logging.getLogger(__name__)


class Reforming(Protocol):
    """What a re-form needs of the :class:`~petmodel.cluster.supervisor.Supervisor` driving the run."""

    snapshots: SnapshotCollector
    progress: RunProgress  # read here, replaced through report()
    last_step: int
    rows: collections.deque[dict[str, Any]]  # metric rows not yet written: dropped, their steps train again
    extra_reservations: list[str]  # released with the run's own reservation when the run ends
    cancel_requested: threading.Event

    @property
    def run(self) -> SupervisedRun: ...

    def form_group(self, slots: dict[str, tuple[int, int]]) -> None: ...

    def report(self, **changes: Any) -> None: ...


def reform(sup: Reforming, decision: Decision, *, grace_s: float) -> bool:
    """Restart the run from its newest snapshot on the workers it still has (plus free ones that pass).

    The global batch stays the same, so the run continues on the same trajectory (DDP is exact);
    metrics past the snapshot are dropped, as those steps are trained again. A run with no survivor
    waits up to ``grace_s`` for a free worker. False when no worker could be had or the new group
    could not start: the caller then fails the run with ``decision.sentence``.
    """
    run, was = sup.run, sup.progress
    sup.snapshots.settle(sup.last_step)
    survivors = [was.workers[r] for r in decision.survivors]
    refused: list[Refusal] = []
    survivors += _replacements(sup, len(was.workers) - len(survivors), refused,
                               wait_s=grace_s if not survivors else 0.0)
    if not survivors:
        return False
    step = sup.snapshots.newest.step if sup.snapshots.newest else 0
    why = _why(decision.sentence, refused)
    lost = tuple({"worker": was.workers[r].address, "rank": r, "step": step, "failed_step": max(sup.last_step, step),
                  "at": time.time(), "why": why} for r in decision.lost)
    log.warning("run %s lost %s; re-forming on %d worker(s) from step %d", run.run_id,
                ", ".join(w["worker"] for w in lost), len(survivors), step)
    run.store.trim_metrics(run.run_id, step)
    sup.rows.clear()
    sup.last_step = step
    workers = tuple(sorted(survivors, key=lambda w: w.host))
    sup.report(workers=workers, restarts=was.restarts + 1, lost_workers=was.lost_workers + lost,
               backend=ddp_backend(list(workers)))  # a replacement may share a GPU the lost worker had alone
    now = sup.progress
    run.store.update_run(run.run_id, restarts=now.restarts, lost_workers=list(now.lost_workers),
                         workers=now.worker_addresses, hosts=now.hosts)
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
        exclude = [*sup.progress.worker_addresses, *(w.address for w in taken), *(r.worker for r in refused)]
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
