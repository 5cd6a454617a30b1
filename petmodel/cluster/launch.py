"""One training run on N workers of a Dask cluster, with PyTorch DDP set up by dask-pytorch-ddp.

The per-worker side is :mod:`petmodel.cluster.ranks`. Here, on the client: :func:`launch_run` reserves
N workers on the scheduler (:mod:`petmodel.cluster.reservations`), records the run and returns its
:class:`RunHandle`, which asks rank 0's worker for a free port and submits one task per worker
pinned to it, everything by keyword (``client.submit`` swallows its own keyword names).

While the run trains, a monitor thread on the client drains the metric rows ranks publish as Dask
events into the run store (and W&B), and writes the training snapshots rank 0 posts to a Dask queue
into the store. When a worker leaves the cluster or freezes, the run re-forms on the remaining
workers (topped up with free ones, or a replacement that joins within a grace period) from its
latest snapshot, with the same global batch, up to ``spec.max_restarts`` times; other rank errors,
and losses past that, fail the run naming the worker. On the first rank error or a cancel it tells
the other ranks to stop (a Dask ``Event`` every rank polls); at the end it saves rank 0's best
``state_dict`` and final snapshot (they come back as the task result: no shared disk).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import distributed
from distributed import Client

from petmodel.config import RunSpec
from petmodel.data import NameCorpus, load_corpus
from petmodel.cluster import registry, reservations, versions
from petmodel.cluster.calls import PING_TIMEOUT_S, first_silent, require_answers, run_each
from petmodel.cluster.ranks import free_port, rank_entry
from petmodel.cluster.shipping import verify_shipped
from petmodel.cluster.workers import WorkerInfo, check_precision_on, choose_workers, cpu_slots, describe_workers
from petmodel.errors import PetmodelError
from petmodel.runner import check_run_fits, finish_run, save_snapshot_quietly, start_record
from petmodel.store import RunStore, metric_record
from petmodel.tracking import Tracker, check_tracking
from petmodel.train import TrainResult
from petmodel.trainstate import TrainState

if TYPE_CHECKING:
    from petmodel.resume import Resume

log = logging.getLogger(__name__)

PG_TIMEOUT_S = 30.0  # a collective that waits longer than this on a silent peer fails the rank
CANCEL_GRACE_S = 15.0  # after a cancel, ranks that have not stopped by then are abandoned
WORKER_CHECK_S = 1.0  # how often the monitor asks the scheduler whether the run's workers are alive
CALL_TIMEOUT_S = 10.0  # bound on each call to the scheduler or a worker while starting a run
SNAPSHOT_POLL_S = 1.0  # how often the monitor collects rank 0's snapshots from the queue
REPLACEMENT_GRACE_S = 30.0  # a run that lost every worker waits this long for a free or new one
_RANK_STATES = {"pending": "training", "finished": "done", "error": "failed", "cancelled": "cancelled", "lost": "lost"}


@dataclass
class RunHandle:
    """A run training in the background, as the process that launched it sees it.

    Made by :func:`launch_run`. Other modules use only its public side: ``run_id``, ``status``
    (running, completed, failed, cancelled or pruned), ``result``, ``error``, ``workers`` /
    ``worker_addresses``, ``rank_results``, and :meth:`done`, :meth:`join`, :meth:`rank_states`,
    :meth:`cancel`, :meth:`wait`. The run's store row is its durable record; the handle lives
    only in this process, in :mod:`petmodel.cluster.registry` while the run is live.
    """

    run_id: str
    client: Client
    store: RunStore
    spec: RunSpec
    corpus: NameCorpus
    workers: list[WorkerInfo]
    backend: str
    on_metrics: Callable[[dict[str, Any]], None] | None = None
    pg_timeout_s: float = PG_TIMEOUT_S  # bounds a rank's wait on a silent peer (rendezvous and collectives)
    reservation: str | None = None  # its key in petmodel.cluster.reservations, released when the run ends
    resume: Resume | None = None  # the snapshot of another run this one continues
    restarts: int = 0
    lost_workers: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    error: str | None = None
    status: str = "running"
    rank_results: list[dict[str, Any]] = field(default_factory=list)
    _futures: list[distributed.Future] = field(default_factory=list, init=False, repr=False)
    _queue: collections.deque = field(default_factory=collections.deque, init=False, repr=False)
    _cancel_requested: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _finished: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _cancel_status: str = field(default="cancelled", init=False, repr=False)
    _cancel_reason: str = field(default="Cancelled by the user.", init=False, repr=False)
    _silent: set[int] = field(default_factory=set, init=False, repr=False)
    # The newest snapshot (step, elapsed, blob) the ranks start from when the run (re-)forms.
    _snapshot: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _origin_s: float = field(default=0.0, init=False, repr=False)  # training seconds before this run
    global_batch: int = field(default=0, init=False)  # kept through re-forms on fewer workers
    _last_step: int = field(default=0, init=False, repr=False)
    _extra_reservations: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.global_batch = self.spec.global_batch
        if self.resume is not None:
            state = self.resume.state
            self.global_batch, self._origin_s, self._last_step = state.global_batch, state.elapsed, state.step
            self._snapshot = {"step": state.step, "elapsed": state.elapsed, "blob": self.resume.blob}

    @property
    def grace_s(self) -> float:
        """How long, after a failure, the monitor waits for the other ranks to stop."""
        return self.pg_timeout_s + 10.0

    @property
    def worker_addresses(self) -> list[str]:
        return [w.address for w in self.workers]

    @property
    def topic(self) -> str:
        return f"petmodel-metrics-{self.run_id}"

    @property
    def cancel_name(self) -> str:
        return f"petmodel-cancel-{self.run_id}"

    @property
    def snapshot_queue(self) -> str:
        return f"petmodel-snapshots-{self.run_id}"

    def done(self) -> bool:
        """Whether the run has ended (in any state) and its record is final."""
        return self._finished.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the run to end; whether it has ended."""
        return self._finished.wait(timeout)

    def rank_states(self) -> dict[int, str]:
        """Each rank's task state as this process sees it: training, done, failed, cancelled or lost."""
        return {rank: _RANK_STATES.get(f.status, str(f.status)) for rank, f in enumerate(list(self._futures))}

    def cancel(self, status: str = "cancelled", reason: str = "Cancelled by the user.") -> None:
        """Ask every rank to stop; the run ends as ``status`` (cancelled, or pruned by a search) within seconds."""
        self._cancel_status, self._cancel_reason = status, reason
        self._cancel_requested.set()

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the run ends; its result dict, or PetmodelError saying why it failed."""
        if not self._finished.wait(timeout):
            raise PetmodelError(f"Run {self.run_id} is still running after {timeout:.0f} s.")
        if self.status == "failed":
            raise PetmodelError(self.error or f"Run {self.run_id} failed.")
        return self.result or {"run_id": self.run_id, "status": self.status}

    # ---- internals
    def _start(self, slots: dict[str, tuple[int, int]]) -> None:
        """Submit one task per rank, each pinned to its worker, then start the monitor thread.

        ``slots``: :func:`~petmodel.cluster.workers.cpu_slots` of the whole cluster, so that ranks
        of concurrent runs on one host pin different cores. On failure, tasks already submitted
        are cancelled (rank 0 would otherwise wait for its peers until the timeout) and the
        error is raised; the caller records it.
        """
        client, chosen = self.client, self.workers
        self._futures = []
        try:
            answers = run_each(client, free_port, [chosen[0].address], timeout=CALL_TIMEOUT_S)
            require_answers(answers, CALL_TIMEOUT_S, "finding a free port for the run")
            port = answers[chosen[0].address]
            client.subscribe_topic(self.topic, self._on_event)
            shared = {"spec": self._segment_spec().to_dict(), "corpus": self.corpus.for_training(),
                      "topic": self.topic, "cancel_name": self.cancel_name, "snapshot_queue": self.snapshot_queue,
                      "resume": self._snapshot["blob"] if self._snapshot else None,
                      "global_batch": self.global_batch}
            [shared_future] = client.scatter([shared], workers=[chosen[0].address], broadcast=False, hash=False,
                                             timeout=CALL_TIMEOUT_S)
            local_ranks: dict[str, int] = {}
            for rank, w in enumerate(chosen):
                cpu_slot, host_workers = slots.get(w.address, (0, 1 << 30))  # unknown: never pin
                local_rank = local_ranks.get(w.host, 0)
                local_ranks[w.host] = local_rank + 1
                self._futures.append(client.submit(
                    rank_entry, shared=shared_future, pg_timeout_s=self.pg_timeout_s, master_addr=chosen[0].host,
                    master_port=port, rank=rank, world_size=len(chosen), backend=self.backend,
                    local_rank=local_rank, cpu_slot=cpu_slot, host_workers=host_workers,
                    workers=[w.address], allow_other_workers=False, pure=False,
                    key=f"petmodel-rank{rank}-{self.run_id}",
                ))
        except Exception:
            with contextlib.suppress(Exception):
                client.cancel(self._futures, force=True)
            with contextlib.suppress(Exception):
                client.unsubscribe_topic(self.topic)
            raise
        if self._thread is None:
            self._thread = threading.Thread(target=self._monitor, name=f"petmodel-run-{self.run_id}", daemon=True)
            self._thread.start()

    def _segment_spec(self) -> RunSpec:
        """The spec the ranks train with now: a re-formed run has only what is left of its time budget."""
        spec = self.spec.with_(workers=len(self.workers))
        if self._snapshot is not None and self.spec.train.max_seconds is not None:
            left = self.spec.train.max_seconds - (self._snapshot["elapsed"] - self._origin_s)
            spec = spec.with_(max_seconds=max(1.0, left))
        return spec

    def _on_event(self, event: Any) -> None:
        """Called on the client's event loop: just queue, the monitor thread does the work."""
        _, msg = event if isinstance(event, tuple) else (None, event)
        self._queue.extend(msg.get("rows", []))

    def _drain(self, tracker: Tracker) -> None:
        rows = []
        while self._queue:
            rows.append(self._queue.popleft())
        if not rows:
            return
        self._last_step = max([self._last_step, *(int(r.get("step") or 0) for r in rows)])
        self.store.add_metrics(self.run_id, [metric_record(r) for r in rows])
        for r in rows:
            tracker.log(r)
            if self.on_metrics:
                try:
                    self.on_metrics(r)
                except Exception:  # a UI callback must never kill the run
                    log.exception("metrics callback failed")

    def _live_workers(self) -> set[str] | None:
        """Addresses of the cluster's workers now, or ``None`` when the scheduler did not say."""
        try:
            return {w.address for w in describe_workers(self.client, timeout=5, probe_gpus=False)}
        except Exception:  # a slow or lost scheduler is not a failed run; ask again next time
            return None

    def _monitor(self) -> None:
        tracker = Tracker(self.spec, self.run_id, self.store.root)
        try:
            with tracker:
                self._supervise(tracker)
        except Exception as err:  # noqa: BLE001 - the record must end in a final state
            log.exception("run monitor failed")
            self._end("failed", error=f"The run's monitor failed: {err}.")
        finally:
            with contextlib.suppress(Exception):  # the client may be closing
                self.client.unsubscribe_topic(self.topic)
            registry.unregister(self.run_id)
            for key in (self.reservation, *self._extra_reservations):
                reservations.release(self.client, key)
            self._finished.set()

    def _supervise(self, tracker: Tracker) -> None:
        """Watch the ranks until the run ends; a lost worker re-forms the run (up to max_restarts)."""
        cancel_event = distributed.Event(self.cancel_name, client=self.client)
        snapshots = distributed.Queue(self.snapshot_queue, client=self.client)
        try:
            while True:
                failure = self._watch(tracker, cancel_event, snapshots)
                if failure is None or not self._silent or self._cancel_requested.is_set():
                    break
                if self.restarts >= self.spec.max_restarts:
                    if self.restarts:
                        failure = (failure[0].replace("the other ranks were stopped", f"the run had already "
                                                      f"re-formed {self.restarts}× (its max_restarts)"), failure[1])
                    break
                if not self._reform(failure):
                    break
        finally:
            with contextlib.suppress(Exception):
                self._collect_snapshots(snapshots)
            with contextlib.suppress(Exception):
                snapshots.close()
        if failure is not None:
            self._end("failed", error=failure[0], failed_worker=failure[1])
            return
        self.rank_results = [f.result() for f in self._futures]
        rank0 = self.rank_results[0]
        save_snapshot_quietly(self.store, self.run_id, self.spec, rank0["state"])
        final = TrainState.from_bytes(rank0["state"])  # the weights travel once, inside the snapshot
        rank0.update(best_state=final.best_state, final_state=final.model, history=final.history)
        if self._cancel_requested.is_set() and self.rank_results[0]["stopped_by"] == "cancel":
            self._end(self._cancel_status, error=self._cancel_reason)
            return
        self._complete(tracker)

    def _watch(self, tracker: Tracker, cancel_event: distributed.Event,
               snapshots: distributed.Queue) -> tuple[str, str | None] | None:
        """Supervise the current ranks until they end; the failure (sentence, worker) or ``None``."""
        failure: tuple[str, str | None] | None = None  # (error sentence, failing worker)
        stop_sent_at: float | None = None
        last_check = last_snapshot = 0.0
        gone = self._silent  # ranks whose worker left the cluster or froze: their tasks may never finish
        while True:
            self._drain(tracker)
            if time.monotonic() - last_snapshot > SNAPSHOT_POLL_S:
                last_snapshot = time.monotonic()
                self._collect_snapshots(snapshots)
            if all(f.done() for rank, f in enumerate(self._futures) if rank not in gone):
                break
            if failure is None:
                for rank, fut in enumerate(self._futures):
                    if fut.status == "error":
                        failure = self._rank_failure(rank, fut)
                        break
            if time.monotonic() - last_check > WORKER_CHECK_S:
                last_check = time.monotonic()
                live = self._live_workers()
                if live is not None:
                    gone |= {r for r, w in enumerate(self.workers) if w.address not in live}
                    if gone and failure is None:
                        failure = self._left_cluster(min(gone))
            if (failure or self._cancel_requested.is_set()) and stop_sent_at is None:
                stop_sent_at = time.monotonic()
                cancel_event.set()
            if stop_sent_at is not None and time.monotonic() - stop_sent_at > (
                    self.grace_s if failure else CANCEL_GRACE_S):
                break  # ranks that still have not returned are abandoned below
            time.sleep(0.1)
        self._drain(tracker)
        if failure is None:
            for rank, fut in enumerate(self._futures):
                if fut.status == "error":
                    failure = self._rank_failure(rank, fut)
                    break
        pending = [f for f in self._futures if not f.done()]
        if pending:
            self.client.cancel(pending, force=True)
        with contextlib.suppress(Exception):  # leave no set Event behind on the scheduler
            cancel_event.clear()
        if failure is None and pending:
            failure = ("Some ranks did not stop in time after the run was cancelled.", None)
        return failure

    def _collect_snapshots(self, snapshots: distributed.Queue) -> None:
        """Write the newest snapshot rank 0 posted (older ones are superseded) into the store."""
        posted = snapshots.get(batch=True, callback_timeout=CALL_TIMEOUT_S)
        if not posted:
            return
        newest = max(posted, key=lambda p: p["step"])
        if self._snapshot is None or newest["step"] >= self._snapshot["step"]:
            save_snapshot_quietly(self.store, self.run_id, self.spec, newest["blob"])
            self._snapshot = newest  # kept in memory for a re-form even when the disk refused it

    def _reform(self, failure: tuple[str, str | None]) -> bool:
        """Restart the run from its newest snapshot on the workers it still has (plus free ones).

        The global batch stays the same, so the run continues on the same trajectory (DDP is exact);
        metrics past the snapshot are dropped, as those steps are trained again. False when no
        worker could be found within :data:`REPLACEMENT_GRACE_S`.
        """
        lost = sorted(self._silent)
        survivors = [w for r, w in enumerate(self.workers) if r not in lost]
        key, extra = reservations.reserve_free(self.client, len(self.workers) - len(survivors),
                                               exclude=self.worker_addresses, cancel=self._cancel_requested,
                                               wait_s=REPLACEMENT_GRACE_S if not survivors else 0.0)
        if key:
            self._extra_reservations.append(key)
        survivors += extra
        if not survivors:
            return False
        step = self._snapshot["step"] if self._snapshot else 0
        for r in lost:
            self.lost_workers.append({"worker": self.workers[r].address, "rank": r, "step": step,
                                      "failed_step": max(self._last_step, step), "at": time.time(), "why": failure[0]})
        self.restarts += 1
        log.warning("run %s lost %s; re-forming on %d worker(s) from step %d", self.run_id,
                    ", ".join(self.workers[r].address for r in lost), len(survivors), step)
        self.store.trim_metrics(self.run_id, step)
        self._queue.clear()
        self._last_step = step
        self.workers = sorted(survivors, key=lambda w: w.host)
        self._silent.clear()
        self.store.update_run(self.run_id, restarts=self.restarts, lost_workers=self.lost_workers,
                              workers=self.worker_addresses, hosts=sorted({w.host for w in self.workers}))
        try:
            self._start(cpu_slots(describe_workers(self.client, timeout=CALL_TIMEOUT_S, probe_gpus=False)))
        except Exception as err:  # noqa: BLE001 - reported as the run's failure by the caller
            log.warning("could not re-form run %s: %s", self.run_id, err)
            return False
        return True

    def _rank_failure(self, rank: int, fut: distributed.Future) -> tuple[str, str | None]:
        worker = self.workers[rank].address
        try:
            exc = fut.exception(timeout=5)
        except Exception:
            exc = None
        live = self._live_workers()
        if live is not None:
            for r, w in enumerate(self.workers):
                if w.address not in live:  # a dead peer is the root cause, not the ranks it broke
                    return self._left_cluster(r)
        # A frozen peer (still in the cluster) makes the healthy ranks time out: blame the one that is silent.
        silent = first_silent(self.client, [w.address for r, w in enumerate(self.workers) if r != rank],
                              timeout=PING_TIMEOUT_S)
        if silent is not None:
            r = self.worker_addresses.index(silent)
            self._silent.add(r)
            return (f"Worker {silent} (rank {r}) stopped answering mid-run (frozen or overloaded); "
                    "the other ranks were stopped.", silent)
        text = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error"
        text = text.strip().splitlines()[0][:300]
        return (f"Rank {rank} on worker {worker} failed ({text}); the other ranks were stopped.", worker)

    def _left_cluster(self, rank: int) -> tuple[str, str | None]:
        self._silent.add(rank)
        worker = self.workers[rank].address
        return (f"Worker {worker} (rank {rank}) left the cluster mid-run (its process died or was killed); "
                "the other ranks were stopped.", worker)

    def _complete(self, tracker: Tracker) -> None:
        rank0 = self.rank_results[0]
        result = TrainResult(best_state=rank0["best_state"], final_state=rank0["final_state"],
                             best_val_nll=rank0["best_val_nll"], final_val_nll=rank0["final_val_nll"],
                             steps=rank0["steps"], epochs_done=0.0, samples=rank0["samples"],
                             global_samples=rank0["global_samples"], train_seconds=rank0["train_seconds"],
                             stopped_by=rank0["stopped_by"], history=rank0["history"])
        extra = {"workers": len(self.workers), "backend": self.backend, "global_batch": self.global_batch,
                 "restarts": self.restarts, "lost_workers": [w["worker"] for w in self.lost_workers],
                 "worker_addresses": self.worker_addresses, "hosts": sorted({w.host for w in self.workers}),
                 "samples_per_s": round(result.global_samples / max(result.train_seconds, 1e-9), 1)}
        try:
            self.result = finish_run(self.store, self.run_id, self.spec, self.corpus, result, extra=extra)
        except PetmodelError as err:
            self._end("failed", error=str(err))
            return
        tracker.finish(self.result, self.result.get("model_path"))
        self.status = "completed"

    def _end(self, status: str, *, error: str | None = None, failed_worker: str | None = None) -> None:
        self.status, self.error = status, error
        self.store.update_run(self.run_id, status=status, finished=time.time(), error=error,
                              failed_worker=failed_worker)
        self.result = {"run_id": self.run_id, "status": status, "error": error, "failed_worker": failed_worker}


def launch_run(client: Client, spec: RunSpec, store: RunStore, *, corpus: NameCorpus | None = None,
               workers: Sequence[str] | None = None, on_metrics: Callable[[dict[str, Any]], None] | None = None,
               study_id: str | None = None, kind: str = "train", run_name: str | None = None,
               pg_timeout_s: float = PG_TIMEOUT_S, wait: bool = False,
               on_queue: Callable[[int, list[str]], None] | None = None,
               cancel: threading.Event | None = None, resume: Resume | None = None) -> RunHandle:
    """Start ``spec`` on ``spec.workers`` workers in the background and return its handle.

    ``workers``: explicit addresses, in rank order (their count is the worker count when
    ``spec.workers`` is 0). ``pg_timeout_s`` bounds how long a rank waits on a silent peer,
    in the rendezvous and in every collective. Workers are reserved on the scheduler
    (:mod:`petmodel.cluster.reservations`): with ``wait`` a launch queues for busy ones
    (``on_queue(position, busy)``, ``cancel`` ends the wait), else it is refused naming them.
    Everything that can be checked before the run starts raises before a store row is written.
    ``resume`` continues another run's snapshot (:mod:`petmodel.resume`) as this new run.
    """
    n = spec.workers or (len(workers) if workers else 1)
    spec = spec if spec.workers == n else spec.with_(workers=n)
    check_tracking(spec)
    corpus = corpus or load_corpus(spec.data)
    check_run_fits(spec, corpus)  # cheap checks first: before any worker is asked for or queued for
    everyone = describe_workers(client)  # one scheduler round trip for the choice and the CPU slots
    if workers:
        choose_workers(client, n, addresses=workers, described=everyone)  # checks the explicit addresses
    held = reservations.hold_workers(client, n, everyone, workers, wait=wait, on_queue=on_queue, cancel=cancel)
    try:
        return _launch_on(client, spec, store, held, everyone, corpus=corpus, on_metrics=on_metrics,
                          study_id=study_id, kind=kind, run_name=run_name, pg_timeout_s=pg_timeout_s, resume=resume)
    except BaseException:
        reservations.release(client, held.key)
        raise


def _launch_on(client: Client, spec: RunSpec, store: RunStore, held: reservations.Reservation,
               everyone: list[WorkerInfo], *, corpus: NameCorpus, on_metrics: Any, study_id: str | None,
               kind: str, run_name: str | None, pg_timeout_s: float, resume: Resume | None = None) -> RunHandle:
    """:func:`launch_run` once its workers are reserved; the handle releases them when the run ends."""
    n = spec.workers
    chosen = choose_workers(client, n, addresses=held.workers, described=everyone)
    verify_shipped(client, [w.address for w in chosen], timeout=CALL_TIMEOUT_S)  # late joiners run our code too
    versions.check_new_workers(client, [w.address for w in chosen], timeout=CALL_TIMEOUT_S)  # and match versions
    check_precision_on(client, spec.train.precision, [w.address for w in chosen], timeout=CALL_TIMEOUT_S)
    backend = "nccl" if all(w.has_gpu for w in chosen) else "gloo"
    run_id = start_record(store, spec, resume=resume, name=run_name or spec.name, kind=kind, study_id=study_id,
                          backend=backend, workers=[w.address for w in chosen], hosts=[w.host for w in chosen])
    handle = RunHandle(run_id=run_id, client=client, store=store, spec=spec, corpus=corpus, workers=chosen,
                       backend=backend, on_metrics=on_metrics, pg_timeout_s=pg_timeout_s, reservation=held.key,
                       resume=resume)
    registry.register(handle)  # before submitting: a concurrent choose_workers must see these workers busy
    try:
        handle._start(cpu_slots(everyone))
    except Exception as err:
        registry.unregister(run_id)
        store.update_run(run_id, status="failed", finished=time.time(), error=f"Could not start the run: {err}")
        raise PetmodelError(f"Could not start the run on the cluster ({err}); check the cluster page.") from None
    return handle
