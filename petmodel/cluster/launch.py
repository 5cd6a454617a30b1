"""One training run on N workers of a Dask cluster, with PyTorch DDP set up by dask-pytorch-ddp.

The per-worker side is :mod:`petmodel.cluster.ranks`. Here, on the client: :func:`launch_run` checks
the run, reserves N workers on the scheduler (:mod:`petmodel.cluster.reservations`), records the run
and returns its :class:`RunHandle`, the run as this process sees it. The work is done by parts:

- :mod:`petmodel.cluster.rank_group` submits one task per worker, pinned to it, and polls them into
  a frozen status;
- :mod:`petmodel.cluster.failure_policy` decides, from that status alone, whether to keep watching,
  stop the ranks, re-form on the surviving workers (a worker left or froze; up to
  ``spec.max_restarts`` times, from the newest snapshot, same global batch), fail, or finish;
- :mod:`petmodel.cluster.failures` types each failure and writes its one sentence;
- :mod:`petmodel.cluster.snapshot_collector` writes rank 0's snapshots into the store;
- :mod:`petmodel.cluster.supervisor` is the thread that wires them to the store, W&B and the registry.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any

from distributed import Client

from petmodel.config import RunSpec
from petmodel.data import NameCorpus, load_corpus
from petmodel.cluster import registry, reservations, scaling, worker_checks
from petmodel.cluster.calls import CALL_TIMEOUT_S
from petmodel.cluster.failures import FailureKind, RankFailure, failure_sentence
from petmodel.cluster.run_progress import RunProgress
from petmodel.cluster.supervisor import PG_TIMEOUT_S, Supervisor
from petmodel.cluster.workers import WorkerInfo, choose_workers, cpu_slots, ddp_backend, describe_workers
from petmodel.errors import PetmodelError
from petmodel.runner import check_run_fits, start_record
from petmodel.status import RunStatus
from petmodel.store import RunStore
from petmodel.tracking import check_tracking

if TYPE_CHECKING:
    from petmodel.resume import Resume

__all__ = ["CALL_TIMEOUT_S", "PG_TIMEOUT_S", "RunHandle", "launch_run"]


@dataclass
class RunHandle:
    """A run training in the background, as the process that launched it sees it.

    Made by :func:`launch_run`. Other modules use only its public side: ``run_id``, ``status``
    (running, completed, failed, cancelled or pruned), ``result``, ``error``, ``workers`` /
    ``worker_addresses``, ``rank_results``, ``global_batch``, ``restarts``, ``lost_workers``, and
    :meth:`done`, :meth:`join`, :meth:`rank_states`, :meth:`cancel`, :meth:`wait`. The run's store row
    is its durable record; the handle lives only in this process, in :mod:`petmodel.cluster.registry`
    while the run is live. What changes as the run goes is its supervisor's :attr:`progress` (one frozen
    value, replaced whole); the handle reads it and writes nothing.
    """

    run_id: str
    client: Client
    store: RunStore
    spec: RunSpec
    corpus: NameCorpus
    first: InitVar[RunProgress]  # the workers and backend it starts on
    on_metrics: Callable[[dict[str, Any]], None] | None = None
    pg_timeout_s: float = PG_TIMEOUT_S  # bounds a rank's wait on a silent peer (rendezvous and collectives)
    reservation: str | None = None  # its key in petmodel.cluster.reservations, released when the run ends
    resume: Resume | None = None  # the snapshot of another run this one continues
    global_batch: int = field(default=0, init=False)  # kept through re-forms on fewer workers
    _supervisor: Supervisor = field(init=False, repr=False)

    def __post_init__(self, first: RunProgress) -> None:
        self.global_batch = self.resume.state.global_batch if self.resume is not None else self.spec.global_batch
        self._supervisor = Supervisor(self, first)

    @property
    def progress(self) -> RunProgress:
        """The run as it stands now (workers, status, restarts, result…), one consistent value."""
        return self._supervisor.progress

    @property
    def status(self) -> RunStatus:
        return self.progress.status

    @property
    def error(self) -> str | None:
        return self.progress.error

    @property
    def result(self) -> dict[str, Any] | None:
        return self.progress.result

    @property
    def workers(self) -> list[WorkerInfo]:
        return list(self.progress.workers)

    @property
    def worker_addresses(self) -> list[str]:
        return self.progress.worker_addresses

    @property
    def backend(self) -> str:
        return self.progress.backend

    @property
    def restarts(self) -> int:
        return self.progress.restarts

    @property
    def lost_workers(self) -> list[dict[str, Any]]:
        return list(self.progress.lost_workers)

    @property
    def rank_results(self) -> list[dict[str, Any]]:
        return list(self.progress.rank_results)

    @property
    def last_step(self) -> int:
        """The last step whose metric rows reached the store."""
        return self._supervisor.last_step

    @property
    def snapshot_step(self) -> int | None:
        """The step of the newest snapshot: where a re-formed group (or a resume) would start."""
        newest = self._supervisor.snapshots.newest
        return newest.step if newest is not None else None

    @property
    def topic(self) -> str:
        """The Dask event topic the ranks publish metric rows on."""
        return f"petmodel-metrics-{self.run_id}"

    @property
    def cancel_name(self) -> str:
        """The Dask Event every rank polls: set, the ranks stop."""
        return f"petmodel-cancel-{self.run_id}"

    @property
    def snapshot_queue(self) -> str:
        """The Dask Queue rank 0 posts its snapshots to."""
        return f"petmodel-snapshots-{self.run_id}"

    def done(self) -> bool:
        """Whether the run has ended (in any state) and its record is final."""
        return self._supervisor.finished.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the run to end; whether it has ended."""
        return self._supervisor.finished.wait(timeout)

    def rank_states(self) -> dict[int, str]:
        """Each rank's task state as this process sees it: training, done, failed, cancelled or lost."""
        return self._supervisor.rank_states()

    def cancel(self, status: RunStatus | str = RunStatus.CANCELLED, reason: str = "Cancelled by the user.") -> None:
        """Ask every rank to stop; the run ends as ``status`` (cancelled, or pruned by a search) within seconds."""
        self._supervisor.cancel(RunStatus(status), reason)

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the run ends; its result dict, or PetmodelError saying why it failed."""
        if not self._supervisor.finished.wait(timeout):
            raise PetmodelError(f"Run {self.run_id} is still running after {timeout:.0f} s.")
        if self.status == RunStatus.FAILED:
            raise PetmodelError(self.error or f"Run {self.run_id} failed.")
        return self.result or {"run_id": self.run_id, "status": self.status}

    def _start(self, slots: dict[str, tuple[int, int]]) -> None:
        """Submit the ranks (raising if they cannot be), then supervise them on a thread of their own."""
        self._supervisor.start(slots)


def launch_run(client: Client, spec: RunSpec, store: RunStore, *, corpus: NameCorpus | None = None,
               workers: Sequence[str] | None = None, on_metrics: Callable[[dict[str, Any]], None] | None = None,
               study_id: str | None = None, kind: str = "train", run_name: str | None = None,
               pg_timeout_s: float = PG_TIMEOUT_S, wait: bool = False,
               on_queue: Callable[[int, list[str]], None] | None = None,
               cancel: threading.Event | None = None, resume: Resume | None = None,
               on_scale: Callable[[str], None] | None = None) -> RunHandle:
    """Start ``spec`` on ``spec.workers`` workers in the background and return its handle.

    ``workers``: explicit addresses, in rank order (their count is the worker count when
    ``spec.workers`` is 0). ``pg_timeout_s`` bounds how long a rank waits on a silent peer,
    in the rendezvous and in every collective. Workers are reserved on the scheduler
    (:mod:`petmodel.cluster.reservations`): with ``wait`` a launch queues for busy ones
    (``on_queue(position, busy)``, ``cancel`` ends the wait), else it is refused naming them.
    Everything that can be checked before the run starts raises before a store row is written.
    ``resume`` continues another run's snapshot (:mod:`petmodel.resume`) as this new run. On a cluster
    that can scale (:mod:`petmodel.cluster.scaling`) a launch short of free workers first asks it for
    them, saying so to ``on_scale``, and waits for them to join.
    """
    n = spec.workers or (len(workers) if workers else 1)
    spec = spec if spec.workers == n else spec.with_(workers=n)
    check_tracking(spec)
    corpus = corpus or load_corpus(spec.data)
    check_run_fits(spec, corpus)  # cheap checks first: before any worker is asked for or queued for
    everyone = describe_workers(client)  # one scheduler round trip for the choice and the CPU slots
    if workers:
        choose_workers(client, n, addresses=workers, described=everyone)  # checks the explicit addresses
    scaler = scaling.scaler_of(client) if not workers else None
    with (scaler.providing(n, everyone, on_scale=on_scale, cancel=cancel) if scaler is not None
          else contextlib.nullcontext(everyone)) as everyone:
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
    # Late joiners run our code, match versions and run the precision: the checks a re-form applies too.
    worker_checks.require_all(client, [w.address for w in chosen], precision=spec.train.precision,
                              timeout=CALL_TIMEOUT_S)
    backend = ddp_backend(chosen)  # nccl only with one GPU per rank; else gloo, on CUDA tensors where ranks have GPUs
    run_id = start_record(store, spec, resume=resume, name=run_name or spec.name, kind=kind, study_id=study_id,
                          backend=backend, workers=[w.address for w in chosen], hosts=[w.host for w in chosen])
    handle = RunHandle(run_id=run_id, client=client, store=store, spec=spec, corpus=corpus,
                       first=RunProgress(workers=tuple(chosen), backend=backend), on_metrics=on_metrics, pg_timeout_s=pg_timeout_s, reservation=held.key,
                       resume=resume)
    registry.register(handle)  # before submitting: a concurrent choose_workers must see these workers busy
    try:
        handle._start(cpu_slots(everyone))
    except Exception as err:
        registry.unregister(run_id)
        error = failure_sentence(RankFailure(FailureKind.START_FAILED, detail=str(err)))
        store.update_run(run_id, status=RunStatus.FAILED, finished=time.time(), error=error)
        if isinstance(err, PetmodelError):  # already one sentence of ours, saying what to do
            raise PetmodelError(str(err)) from None
        raise PetmodelError(f"Could not start the run on the cluster ({err}); check the cluster page.") from None
    return handle
