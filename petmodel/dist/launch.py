"""One training run on N workers of a Dask cluster, with PyTorch DDP set up by dask-pytorch-ddp.

The per-worker side is :mod:`petmodel.dist.ranks`. Here, on the client: choose N free workers in
a stable rank order, ask rank 0's worker for a free port, submit one task per worker pinned to
it, everything by keyword (``client.submit`` swallows its own keyword names).

While the run trains, a monitor thread on the client:
- drains metric rows that ranks publish as Dask events into the run store (and W&B);
- watches the chosen workers: one that leaves the cluster fails the run, naming it;
- on the first rank error, or a cancel, tells the other ranks to stop (a Dask ``Event``
  every rank polls) and releases them; the process group's timeout bounds any wait;
- on success saves rank 0's best ``state_dict`` as the run's checkpoint. Weights come back
  through the task result, so workers and client need no shared file system.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import distributed
from distributed import Client

from petmodel.config import RunSpec
from petmodel.data import NameCorpus, load_corpus
from petmodel.dist import registry
from petmodel.dist.ranks import free_port, rank_entry
from petmodel.dist.workers import WorkerInfo, cpu_slots, describe_workers
from petmodel.errors import PetmodelError, UsageError
from petmodel.runner import finish_run
from petmodel.store import RunStore, current_owner, metric_record
from petmodel.tracking import Tracker, check_tracking

log = logging.getLogger(__name__)

PG_TIMEOUT_S = 30.0  # a collective that waits longer than this on a silent peer fails the rank


def choose_workers(client: Client, n: int, *, addresses: Sequence[str] | None = None,
                   described: Sequence[WorkerInfo] | None = None) -> list[WorkerInfo]:
    """N free workers in a stable order (rank i = i-th); explicit ``addresses`` keep their order.

    ``described``: the cluster's workers when the caller already asked the scheduler for them.
    """
    if not isinstance(n, int) or n < 1:
        raise UsageError(f"Workers must be a whole number ≥ 1, not {n!r}.")
    workers = list(described) if described is not None else describe_workers(client)
    if addresses:
        by_addr = {w.address: w for w in workers}
        missing = [a for a in addresses if a not in by_addr]
        if missing:
            raise PetmodelError(f"Worker {missing[0]} is not in the cluster; pick from the current workers.")
        return [by_addr[a] for a in addresses]
    if n > len(workers):
        raise PetmodelError(f"Asked for {n} workers but the cluster has {len(workers)}; "
                            "start more workers or ask for fewer.")
    busy = registry.busy_workers()
    free = [w for w in workers if w.address not in busy]
    if n > len(free):
        raise PetmodelError(f"Asked for {n} workers but only {len(free)} of the cluster's {len(workers)} are free "
                            "(the others are training); wait for a run to finish or ask for fewer.")
    # Group ranks by host so local ranks are contiguous (and rank 0 is the first host's first worker).
    return sorted(free[:n], key=lambda w: (w.host, free.index(w)))


@dataclass
class RunHandle:
    """A run in the background: ``status``, ``wait()``, ``cancel()``; its store row is the record."""

    run_id: str
    client: Client
    store: RunStore
    spec: RunSpec
    corpus: NameCorpus
    workers: list[WorkerInfo]
    backend: str
    on_metrics: Callable[[dict[str, Any]], None] | None = None
    grace_s: float = PG_TIMEOUT_S + 10.0
    result: dict[str, Any] | None = None
    error: str | None = None
    status: str = "running"
    rank_results: list[dict[str, Any]] = field(default_factory=list)
    _futures: list[distributed.Future] = field(default_factory=list)
    _queue: collections.deque = field(default_factory=collections.deque)
    _cancel_requested: threading.Event = field(default_factory=threading.Event)
    _finished: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _cancel_status: str = "cancelled"
    _cancel_reason: str = "Cancelled by the user."

    @property
    def worker_addresses(self) -> list[str]:
        return [w.address for w in self.workers]

    @property
    def topic(self) -> str:
        return f"petmodel-metrics-{self.run_id}"

    @property
    def cancel_name(self) -> str:
        return f"petmodel-cancel-{self.run_id}"

    def done(self) -> bool:
        return self._finished.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the run to end; whether it has ended."""
        return self._finished.wait(timeout)

    def rank_states(self) -> dict[int, str]:
        """Each rank's task state as this process sees it: training, done, failed, cancelled or lost."""
        names = {"pending": "training", "finished": "done", "error": "failed", "cancelled": "cancelled",
                 "lost": "lost"}
        return {rank: names.get(f.status, str(f.status)) for rank, f in enumerate(list(self._futures))}

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
        self.store.add_metrics(self.run_id, [metric_record(r) for r in rows])
        for r in rows:
            tracker.log(r)
            if self.on_metrics:
                try:
                    self.on_metrics(r)
                except Exception:  # a UI callback must never kill the run
                    log.exception("metrics callback failed")

    def _live_workers(self) -> set[str] | None:
        try:
            info = self.client.sync(self.client.scheduler.identity, n_workers=-1, callback_timeout=5)
            return set(info.get("workers", {}))
        except Exception:
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
            try:
                self.client.unsubscribe_topic(self.topic)
            except Exception:
                pass
            registry.unregister(self.run_id)
            self._finished.set()

    def _supervise(self, tracker: Tracker) -> None:
        cancel_event = distributed.Event(self.cancel_name, client=self.client)
        failure: tuple[str, str | None] | None = None  # (error sentence, failing worker)
        stop_sent_at: float | None = None
        last_check = 0.0
        while True:
            self._drain(tracker)
            if all(f.done() for f in self._futures):
                break
            if failure is None:
                for rank, fut in enumerate(self._futures):
                    if fut.status == "error":
                        failure = self._rank_failure(rank, fut)
                        break
            if failure is None and time.monotonic() - last_check > 1.0:
                last_check = time.monotonic()
                live = self._live_workers()
                if live is not None:
                    gone = [(r, w) for r, w in enumerate(self.workers) if w.address not in live]
                    if gone:
                        rank, w = gone[0]
                        failure = (f"Worker {w.address} (rank {rank}) left the cluster mid-run (its process died "
                                   "or was killed); the other ranks were stopped.", w.address)
            if (failure or self._cancel_requested.is_set()) and stop_sent_at is None:
                stop_sent_at = time.monotonic()
                cancel_event.set()
            if stop_sent_at is not None and time.monotonic() - stop_sent_at > (
                    self.grace_s if failure else 15.0):
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
        try:
            cancel_event.clear()
        except Exception:
            pass
        if failure is None and pending:
            failure = ("Some ranks did not stop in time after the run was cancelled.", None)
        if failure is not None:
            self._end("failed", error=failure[0], failed_worker=failure[1])
            return
        self.rank_results = [f.result() for f in self._futures]
        if self._cancel_requested.is_set() and self.rank_results[0]["stopped_by"] == "cancel":
            self._end(self._cancel_status, error=self._cancel_reason)
            return
        self._complete(tracker)

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
                    return (f"Worker {w.address} (rank {r}) left the cluster mid-run (its process died or was "
                            "killed); the other ranks were stopped.", w.address)
        text = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error"
        text = text.strip().splitlines()[0][:300]
        return (f"Rank {rank} on worker {worker} failed ({text}); the other ranks were stopped.", worker)

    def _complete(self, tracker: Tracker) -> None:
        rank0 = self.rank_results[0]
        from petmodel.train import TrainResult

        result = TrainResult(best_state=rank0["best_state"], final_state=rank0["final_state"],
                             best_val_nll=rank0["best_val_nll"], final_val_nll=rank0["final_val_nll"],
                             steps=rank0["steps"], epochs_done=0.0, samples=rank0["samples"],
                             global_samples=rank0["global_samples"], train_seconds=rank0["train_seconds"],
                             stopped_by=rank0["stopped_by"], history=rank0["history"])
        extra = {"workers": len(self.workers), "backend": self.backend, "global_batch": self.spec.global_batch,
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
               pg_timeout_s: float = PG_TIMEOUT_S) -> RunHandle:
    """Start ``spec`` on ``spec.workers`` workers in the background and return its handle."""
    n = spec.workers or (len(workers) if workers else 1)
    spec = spec if spec.workers == n else spec.with_(workers=n)
    check_tracking(spec)
    everyone = describe_workers(client)  # one scheduler round trip for the choice and the CPU slots
    chosen = choose_workers(client, n, addresses=workers, described=everyone)
    corpus = corpus or load_corpus(spec.data)
    if spec.global_batch > len(corpus.train_names):
        raise UsageError(f"The global batch ({spec.train.batch_size} per worker × {n} workers = {spec.global_batch}) "
                         f"is larger than the {len(corpus.train_names):,} training names; use a smaller batch.")
    backend = "nccl" if all(w.has_gpu for w in chosen) else "gloo"
    run_id = store.create_run(spec.to_dict(), name=run_name or spec.name, kind=kind, study_id=study_id,
                              status="running", owner=current_owner())
    store.update_run(run_id, started=time.time(), backend=backend, workers=[w.address for w in chosen],
                     hosts=[w.host for w in chosen])
    handle = RunHandle(run_id=run_id, client=client, store=store, spec=spec, corpus=corpus, workers=chosen,
                       backend=backend, on_metrics=on_metrics, grace_s=pg_timeout_s + 10.0)
    registry.register(handle)
    try:
        port = client.run(free_port, workers=[chosen[0].address])[chosen[0].address]
        client.subscribe_topic(handle.topic, handle._on_event)
        local_ranks: dict[str, int] = {}
        slots = cpu_slots(everyone)
        shared = {"spec": spec.to_dict(), "train_names": corpus.train_names, "val_names": corpus.val_names,
                  "alphabet": corpus.alphabet.chars, "topic": handle.topic, "cancel_name": handle.cancel_name}
        [shared_future] = client.scatter([shared], broadcast=False, hash=False)
        for rank, w in enumerate(chosen):
            cpu_slot, host_workers = slots.get(w.address, (0, 1 << 30))  # unknown: never pin
            local_rank = local_ranks.get(w.host, 0)
            local_ranks[w.host] = local_rank + 1
            handle._futures.append(client.submit(
                rank_entry, shared=shared_future, pg_timeout_s=pg_timeout_s, master_addr=chosen[0].host,
                master_port=port, rank=rank, world_size=n, backend=backend, local_rank=local_rank,
                cpu_slot=cpu_slot, host_workers=host_workers,
                workers=[w.address], allow_other_workers=False, pure=False,
                key=f"petmodel-rank{rank}-{run_id}",
            ))
    except Exception as err:
        registry.unregister(run_id)
        store.update_run(run_id, status="failed", finished=time.time(), error=f"Could not start the run: {err}")
        raise PetmodelError(f"Could not start the run on the cluster ({err}); check the cluster page.") from None
    handle._thread = threading.Thread(target=handle._monitor, name=f"petmodel-run-{run_id}", daemon=True)
    handle._thread.start()
    return handle
