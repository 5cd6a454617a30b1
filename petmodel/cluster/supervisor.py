"""The thread that drives one cluster run, wiring the rank group, the failure policy and the store.

Every tick it drains the metric rows the ranks publish as Dask events (into the store, W&B and the
caller's callback), collects rank 0's snapshots (:mod:`~petmodel.cluster.snapshot_collector`), polls
the run's :class:`~petmodel.cluster.rank_group.RankGroup` and does what
:func:`~petmodel.cluster.failure_policy.decide` says: tell the ranks to stop, end the formation,
re-form on the surviving workers (topped up with free ones) from the newest snapshot, fail naming
the worker, or record the completed run. Whatever happens, it then releases the run's reservations
and unregisters it. The decisions live in the policy; this module only carries them out.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from petmodel.cluster import registry, reservations
from petmodel.cluster.calls import CALL_TIMEOUT_S
from petmodel.cluster.failure_policy import CANCEL_GRACE_S, Action, Decision, decide, final_status
from petmodel.cluster.failures import (
    FailureKind,
    GroupStatus,
    RankFailure,
    error_summary,
    failure_sentence,
    lost_the_scheduler,
)
from petmodel.cluster.heartbeat import Heartbeat
from petmodel.cluster.rank_group import RankGroup
from petmodel.cluster.reform import reform
from petmodel.cluster.run_progress import RunPhase, RunProgress, Snapshot, SupervisedRun
from petmodel.cluster.snapshot_collector import SnapshotCollector
from petmodel.compat import client_running, set_event_within
from petmodel.config import RunSpec
from petmodel.errors import PetmodelError, SchedulerSilent, StoreBusy
from petmodel.runner import finish_run, save_snapshot_quietly
from petmodel.status import RunStatus
from petmodel.store import metric_record
from petmodel.tracking import Tracker
from petmodel.train import TrainResult
from petmodel.trainstate import TrainState

if TYPE_CHECKING:
    from petmodel.store import RunStore

log = logging.getLogger(__name__)
T = TypeVar("T")

PG_TIMEOUT_S = 30.0  # a collective that waits longer than this on a silent peer fails the rank
WORKER_CHECK_S = 1.0  # how often the supervisor asks the scheduler whether the run's workers are alive
SNAPSHOT_POLL_S = 1.0  # how often it collects rank 0's snapshots from the queue
REPLACEMENT_GRACE_S = 30.0  # a run that lost every worker waits this long for a free or new one
TICK_S = 0.1
# The run store may refuse writes for a while (another process holding its lock, a full disk): the run keeps its
# rows and tries again for this long before it fails for it; then the final record is tried again every
# RECORD_RETRY_S for as long as this process lives, so an app's run never stays "running" in the store.
STORE_GRACE_S = 60.0
RECORD_RETRY_S = 5.0


@dataclass(frozen=True)
class RanksReturned:
    """What the client keeps of the ranks' task results once they all finished."""

    result: TrainResult  # rank 0's, as in-process training returns it
    snapshot: bytes  # rank 0's final snapshot, as it travelled (what a resume continues)
    rank_results: list[dict[str, Any]]  # ``handle.rank_results``: rank 0's with its weights and history


def _train_result(outcomes: list[Any]) -> RanksReturned:
    """The ranks' task results (:class:`~petmodel.cluster.ranks.RankOutcome`) as the client uses them.

    The one place that knows their shape. The weights travel once, inside rank 0's snapshot.
    """
    rank0 = outcomes[0]
    result = TrainResult(state=TrainState.from_bytes(rank0.state), stopped_by=rank0.stopped_by,
                         samples=rank0.samples, train_seconds=rank0.train_seconds)
    rows = [dataclasses.asdict(o) for o in outcomes]
    rows[0].update(best_state=result.best_state, final_state=result.final_state, history=result.history,
                   best_val_nll=result.best_val_nll, final_val_nll=result.final_val_nll,
                   global_samples=result.global_samples)
    return RanksReturned(result, rank0.state, rows)


Policy = Callable[..., Decision]  # :func:`petmodel.cluster.failure_policy.decide`'s signature


class Supervisor:
    """Drives one run from its first formation to its final record.

    It reads the run's fixed inputs (:class:`~petmodel.cluster.run_progress.SupervisedRun`) and reports by
    replacing :attr:`progress`, a frozen :class:`~petmodel.cluster.run_progress.RunProgress` that the run's
    handle reads; what to do about each formation's end is ``policy``'s to decide.
    """

    def __init__(self, run: SupervisedRun, progress: RunProgress, *, policy: Policy = decide) -> None:
        self.run = run
        self.progress = progress
        self.policy = policy
        self.rows: collections.deque[dict[str, Any]] = collections.deque()  # metric rows not yet written
        self.cancel_requested = threading.Event()
        self.cancel_status: RunStatus = RunStatus.CANCELLED
        self.cancel_reason = "Cancelled by the user."
        self.finished = threading.Event()
        self.group: RankGroup | None = None
        self.snapshots = SnapshotCollector(run.store, run.run_id, run.spec, run.snapshot_queue)
        self.origin_s = 0.0  # training seconds before this run (a resumed run's)
        self.last_step = 0
        self.store_refused_since: float | None = None  # when the store began refusing the run's rows
        self.extra_reservations: list[str] = []  # workers reserved when the run re-formed
        self.heartbeat = Heartbeat()  # when the scheduler last answered: a silence past its bound ends the run
        self.scheduler = _scheduler_address(run.client)  # asked now: a client that lost it may no longer say
        self._thread: threading.Thread | None = None
        if run.resume is not None:
            state = run.resume.state
            self.origin_s, self.last_step = state.elapsed, state.step
            self.snapshots.newest = Snapshot(step=state.step, elapsed=state.elapsed, blob=run.resume.blob)

    @property
    def grace_s(self) -> float:
        """How long, after a failure, the supervisor waits for the other ranks to stop."""
        return self.run.pg_timeout_s + 10.0

    def start(self, slots: dict[str, tuple[int, int]]) -> None:
        """Form the first group (raising if it cannot be submitted), then start the supervising thread."""
        self.form_group(slots)
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=f"petmodel-run-{self.run.run_id}", daemon=True)
            self._thread.start()

    def cancel(self, status: RunStatus, reason: str) -> None:
        self.cancel_status, self.cancel_reason = status, reason
        self.cancel_requested.set()

    def rank_states(self) -> dict[int, str]:
        return self.group.rank_states() if self.group is not None else {}

    # ---- forming a group
    def form_group(self, slots: dict[str, tuple[int, int]]) -> None:
        """Submit a group of ranks on the progress's workers (the first, or those of a re-form), listening to its rows."""
        run = self.run
        self.group = group = RankGroup(run.client, run.run_id, list(self.progress.workers))
        run.client.subscribe_topic(run.topic, self._on_event)
        try:
            group.submit(self._payload(), slots, backend=self.progress.backend, pg_timeout_s=run.pg_timeout_s)
        except Exception:
            with contextlib.suppress(Exception):
                run.client.unsubscribe_topic(run.topic)
            raise
        self.report(phase=RunPhase.TRAINING)

    def _payload(self) -> dict[str, Any]:
        """What every rank of a new group gets (scattered once): spec, names, where to report, where to start."""
        run, snapshot = self.run, self.snapshots.newest
        return {"spec": self._segment_spec().to_dict(), "corpus": run.corpus.for_training(), "topic": run.topic,
                "cancel_name": run.cancel_name, "snapshot_queue": run.snapshot_queue,
                "resume": snapshot.blob if snapshot else None, "global_batch": run.global_batch}

    def _segment_spec(self) -> RunSpec:
        """The spec the ranks train with now: a re-formed run has only what is left of its time budget."""
        spec, snapshot = self.run.spec, self.snapshots.newest
        segment = spec.with_(workers=len(self.progress.workers))
        if snapshot is not None and spec.train.max_seconds is not None:
            left = spec.train.max_seconds - (snapshot.elapsed - self.origin_s)
            segment = segment.with_(max_seconds=max(1.0, left))
        return segment

    # ---- metrics
    def _on_event(self, event: Any) -> None:
        """Called on the client's event loop: just queue, the supervising thread does the work."""
        _, msg = event if isinstance(event, tuple) else (None, event)
        self.heartbeat.beat()
        self.rows.extend(msg.get("rows", []))

    def _drain(self, tracker: Tracker) -> None:
        rows = []
        while self.rows:
            rows.append(self.rows.popleft())
        if not rows:
            return
        run = self.run
        try:
            run.store.add_metrics(run.run_id, [metric_record(r) for r in rows])
        except StoreBusy as err:
            self.rows.extendleft(reversed(rows))  # kept, in order, for the next tick
            self._store_refused(err)
            return
        self.store_refused_since = None
        self.last_step = max([self.last_step, *(int(r.get("step") or 0) for r in rows)])
        for r in rows:
            tracker.log(r)
            if run.on_metrics:
                try:
                    run.on_metrics(r)
                except Exception:  # a UI callback must never kill the run
                    log.exception("metrics callback failed")

    # ---- supervising
    def _main(self) -> None:
        run = self.run
        tracker = Tracker(run.spec, run.run_id, run.store.root)
        try:
            with tracker:
                self._supervise(tracker)
        except SchedulerSilent as err:  # silent past the run's heartbeat: said as any lost scheduler
            self._end(RunStatus.FAILED, error=failure_sentence(self._monitor_failure(err)))
        except PetmodelError as err:  # ours: already the one sentence to show
            self._end(RunStatus.FAILED, error=str(err))
        except Exception as err:  # noqa: BLE001 - the record must end in a final state
            self._end(RunStatus.FAILED, error=failure_sentence(self._monitor_failure(err)))
        finally:
            with contextlib.suppress(Exception):  # the client may be closing
                run.client.unsubscribe_topic(run.topic)
            registry.unregister(run.run_id)
            if self.group is not None:
                self.group.forget()  # the ranks' results leave the workers, which can then be given back
            for key in (run.reservation, *self.extra_reservations):
                reservations.release(run.client, key)
            self.finished.set()

    def _monitor_failure(self, err: Exception) -> RankFailure:
        """What ended the supervision: the scheduler gone (one sentence, no traceback: it is not our bug,
        and the run can go on from its snapshot) or a failure of the monitor itself (logged in full)."""
        run = self.run
        if isinstance(err, SchedulerSilent) or lost_the_scheduler(err, run.client):
            log.info("run %s: lost the scheduler (%s)", run.run_id, error_summary(err))
            resumable = run.store.state_path(run.run_id).is_file()
            silent = f"{err}; " if isinstance(err, SchedulerSilent) else ""
            detail = silent + (f"the run stopped at step {self.last_step} and can be resumed with `python -m petmodel train "
                      f"--resume {run.run_id}` once a scheduler is back." if resumable else
                      f"the run stopped at step {self.last_step} before its first snapshot; start it again once a "
                      "scheduler is back.")
            return RankFailure(FailureKind.SCHEDULER_LOST, worker=self.scheduler or _scheduler_address(run.client),
                               detail=detail)
        log.exception("run monitor failed")
        return RankFailure(FailureKind.MONITOR_FAILED, detail=error_summary(err))

    def _supervise(self, tracker: Tracker) -> None:
        """Watch each formation until it ends; re-form while the policy says so, then record the end."""
        self.snapshots.open(self.run.client)
        try:
            while True:
                decision = self._watch(tracker)
                if decision.action is not Action.REFORM or not self._reform(decision):
                    break
        finally:
            self.snapshots.close()
        if decision.action is Action.FINISH:
            self._finish(tracker)
        else:  # FAIL, or a re-form that found no worker or could not start
            worker = decision.failure.worker if decision.failure is not None else None
            self._end(RunStatus.FAILED, error=decision.sentence, failed_worker=worker)

    def _watch(self, tracker: Tracker) -> Decision:
        """Supervise the current group until it ends; the policy's decision on how it ended."""
        group = self.group
        assert group is not None
        stop_sent_at: float | None = None
        last_check = last_snapshot = 0.0
        while True:
            self._drain(tracker)
            if time.monotonic() - last_snapshot > SNAPSHOT_POLL_S:
                last_snapshot = time.monotonic()
                self._collect_snapshots()
            check = time.monotonic() - last_check > WORKER_CHECK_S
            if check:
                last_check = time.monotonic()
            decision = self._decide(group.poll(check_workers=check), stop_sent_at)
            if group.answered_at is not None:
                self.heartbeat.beat(group.answered_at)
            if self.heartbeat.lost():
                raise SchedulerSilent(f"nothing was heard from it for {self.heartbeat.silent_for():.0f} s")
            if decision.action is Action.STOP_RANKS:
                self.report(phase=RunPhase.STOPPING)
                if self._set_cancel_event(True):  # every rank polls it; not sent: tried again next tick
                    stop_sent_at = time.monotonic()
            elif decision.action is Action.END:
                break
            time.sleep(TICK_S)
        self._drain(tracker)
        while self.rows and self.store_refused_since is not None:  # the store refuses them: wait, within its grace
            time.sleep(1.0)
            self._drain(tracker)
        status = group.stop()  # ranks that still have not returned are abandoned
        self._set_cancel_event(False)  # leave no set Event behind on the scheduler
        return self._decide(status, stop_sent_at)

    def _set_cancel_event(self, value: bool) -> bool:
        """Set (or clear) the Event every rank polls, bounded (a frozen scheduler must not hang the supervisor,
        whose heartbeat then decides); whether the scheduler took it."""
        try:
            set_event_within(self.run.client, self.run.cancel_name, value, timeout=CALL_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - a timeout or a lost scheduler: the heartbeat has the last word
            log.info("run %s: the stop signal did not reach the scheduler (%s)", self.run.run_id, error_summary(err))
            return False
        return True

    def _collect_snapshots(self) -> None:
        """Collect rank 0's snapshots, waiting on the scheduler at most what the heartbeat has left: a slow answer
        (a snapshot over a slow link) is not a lost scheduler; a client that lost it raises at once."""
        try:
            self.snapshots.collect(stored_step=self.last_step, timeout=max(CALL_TIMEOUT_S, self.heartbeat.left_s()))
        except OSError as err:  # TimeoutError and a closed comm; the heartbeat decides whether it is fatal
            if not client_running(self.run.client):
                raise
            log.info("run %s: no snapshot answer this time (%s)", self.run.run_id, error_summary(err))
            return
        self.heartbeat.beat()

    def _decide(self, status: GroupStatus, stop_sent_at: float | None) -> Decision:
        return self.policy(status, restarts=self.progress.restarts, max_restarts=self.run.spec.max_restarts,
                      cancel_requested=self.cancel_requested.is_set(),
                      stopping_for_s=None if stop_sent_at is None else time.monotonic() - stop_sent_at,
                      grace_s=self.grace_s, cancel_grace_s=CANCEL_GRACE_S)

    def _reform(self, decision: Decision) -> bool:
        """Restart the run from its newest snapshot on the workers it still has (plus free ones that pass
        every launch check): the steps are :func:`petmodel.cluster.reform.reform`'s. False when no worker
        could be had within :data:`REPLACEMENT_GRACE_S` or the new group could not start."""
        self.report(phase=RunPhase.REFORMING)
        return reform(self, decision, grace_s=REPLACEMENT_GRACE_S)

    # ---- the end
    def _finish(self, tracker: Tracker) -> None:
        """The ranks returned: keep rank 0's final snapshot, then record the run as cancelled or completed."""
        run = self.run
        assert self.group is not None
        self.report(phase=RunPhase.FINISHING)
        try:
            returned = _train_result(self.group.results())
        except PetmodelError as err:  # the results never arrived: fail in one sentence, keeping the snapshot
            self._end(RunStatus.FAILED, error=str(err))
            return
        result = returned.result
        self.report(rank_results=tuple(returned.rank_results))
        save_snapshot_quietly(run.store, run.run_id, run.spec, returned.snapshot)
        status = final_status(self.cancel_requested.is_set(), result.stopped_by, self.cancel_status)
        if status is not RunStatus.COMPLETED:
            self._end(status, error=self.cancel_reason)
            return
        now = self.progress
        extra = {"workers": len(now.workers), "backend": now.backend, "global_batch": run.global_batch,
                 "restarts": now.restarts, "lost_workers": [w["worker"] for w in now.lost_workers],
                 "worker_addresses": now.worker_addresses, "hosts": now.hosts,
                 "samples_per_s": round(result.global_samples / max(result.train_seconds, 1e-9), 1)}
        try:
            record = patiently(lambda: finish_run(run.store, run.run_id, run.spec, run.corpus, result, extra=extra))
        except PetmodelError as err:
            self._end(RunStatus.FAILED, error=str(err))
            return
        tracker.finish(record, record.get("model_path"))
        self.report(result=record, status=RunStatus.COMPLETED, phase=RunPhase.ENDED)

    def _end(self, status: RunStatus, *, error: str | None = None, failed_worker: str | None = None) -> None:
        run = self.run
        self.report(status=status, error=error, phase=RunPhase.ENDED,
                    result={"run_id": run.run_id, "status": status, "error": error, "failed_worker": failed_worker})
        fields = {"status": status, "finished": time.time(), "error": error, "failed_worker": failed_worker}
        try:
            patiently(lambda: run.store.update_run(run.run_id, **fields))
        except StoreBusy as err:  # the record must still end final: keep trying, off this thread
            log.warning("run %s: the store refused its final record (%s); trying again every %g s",
                        run.run_id, err, RECORD_RETRY_S)
            threading.Thread(target=_record_later, args=(run.store, run.run_id, fields), daemon=True,
                             name=f"petmodel-record-{run.run_id}").start()

    def report(self, **changes: Any) -> None:
        """Replace :attr:`progress` with ``changes`` applied: readers on other threads see the old value or the
        new one, whole."""
        self.progress = dataclasses.replace(self.progress, **changes)

    def _store_refused(self, err: StoreBusy) -> None:
        """The store refused the run's rows: fine for :data:`STORE_GRACE_S`, then the run fails in one sentence."""
        now = time.monotonic()
        if self.store_refused_since is None:
            self.store_refused_since = now
            log.warning("run %s: the store refused its rows (%s); keeping them", self.run.run_id, err)
        elif now - self.store_refused_since > STORE_GRACE_S:
            run = self.run
            kept = (f"resume it with `python -m petmodel train --resume {run.run_id}` once the store takes writes"
                    if run.store.state_path(run.run_id).is_file() else "it had no snapshot yet")
            raise PetmodelError(f"The run store could not record the run for {STORE_GRACE_S:g} s, so it was stopped "
                                f"({kept}): {err}")


def patiently(write: Callable[[], T]) -> T:
    """``write`` (to the run store), tried again every second while the store refuses it, for up to
    :data:`STORE_GRACE_S`; its :class:`StoreBusy` after that."""
    deadline = time.monotonic() + STORE_GRACE_S
    while True:
        try:
            return write()
        except StoreBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def _record_later(store: RunStore, run_id: str, fields: dict[str, Any]) -> None:
    """A run's final record, tried every :data:`RECORD_RETRY_S` until the store takes it (an app lives on; a CLI
    that exits leaves it to the next ``reconcile_orphans``, which fails runs whose process is gone)."""
    while True:
        time.sleep(RECORD_RETRY_S)
        try:
            store.update_run(run_id, **fields)
            log.info("run %s: its final record is written", run_id)
            return
        except StoreBusy:
            continue
        except Exception:  # noqa: BLE001 - nothing more to do from here; the reaper has the last word
            log.exception("run %s: its final record could not be written", run_id)
            return


def _scheduler_address(client: Any) -> str | None:
    """The scheduler's address as this client knows it, without asking the (lost) scheduler."""
    from petmodel.compat import scheduler_address

    with contextlib.suppress(Exception):
        return scheduler_address(client)
    return None
