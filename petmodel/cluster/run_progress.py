"""What a cluster run is given and what it has become, as types: the one contract between the supervisor
that drives a run and the handle that shows it.

:class:`SupervisedRun` is what the :class:`~petmodel.cluster.supervisor.Supervisor` reads of the run it
drives (fixed at launch); :class:`RunProgress` is what it reports back, one frozen value it *replaces*
whenever something changes (workers after a re-form, the end), so a reader on another thread (a
Streamlit page, a study) always sees one consistent state, never a half-written one. The
:class:`~petmodel.cluster.launch.RunHandle` only reads it. Neither the supervisor nor the re-form
import :mod:`~petmodel.cluster.launch`: the handle satisfies :class:`SupervisedRun` by its shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from petmodel.cluster.workers import WorkerInfo
from petmodel.status import RunStatus

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.config import RunSpec
    from petmodel.data import NameCorpus
    from petmodel.resume import Resume
    from petmodel.store import RunStore


class RunPhase(StrEnum):
    """Where the supervisor's state machine is; each step is one :meth:`Supervisor.report`.

    STARTING → TRAINING → (STOPPING →) either REFORMING → TRAINING again, or FINISHING (the ranks returned) or
    straight to ENDED (failed, or the scheduler lost); FINISHING → ENDED.
    """

    STARTING = "starting"  # the first group is being submitted
    TRAINING = "training"  # a group is formed; watching it
    STOPPING = "stopping"  # the ranks were told to stop (a cancel, a failed peer); waiting for them
    REFORMING = "reforming"  # a worker was lost: reserving, checking and forming the next group
    FINISHING = "finishing"  # the ranks returned: fetching their results, writing the final record
    ENDED = "ended"  # the record is final (``status`` says how it ended)


@dataclass(frozen=True)
class Snapshot:
    """Rank 0's training snapshot as the client keeps it: a re-formed group starts from the newest."""

    step: int
    elapsed: float  # training seconds at the snapshot, a resumed run's included
    blob: bytes  # :meth:`petmodel.trainstate.TrainState.to_bytes`

    @classmethod
    def posted(cls, message: dict[str, Any]) -> Snapshot:
        """A snapshot as rank 0 posts it on the run's queue (:class:`petmodel.cluster.ranks._SnapshotSender`)."""
        return cls(step=int(message["step"]), elapsed=float(message["elapsed"]), blob=message["blob"])


@dataclass(frozen=True)
class RunProgress:
    """A cluster run as it stands: replaced whole by its supervisor, read by its handle."""

    workers: tuple[WorkerInfo, ...]  # in rank order; fewer after a re-form on the survivors
    backend: str  # "gloo" or "nccl"
    phase: RunPhase = RunPhase.STARTING
    status: RunStatus = RunStatus.RUNNING
    restarts: int = 0
    lost_workers: tuple[dict[str, Any], ...] = ()  # worker, rank, step, failed_step, at, why (as the store keeps)
    result: dict[str, Any] | None = None  # the final record (completed: finish_run's; else status and error)
    error: str | None = None
    rank_results: tuple[dict[str, Any], ...] = ()  # each rank's outcome; rank 0's with weights and history

    @property
    def worker_addresses(self) -> list[str]:
        return [w.address for w in self.workers]

    @property
    def hosts(self) -> list[str]:
        return sorted({w.host for w in self.workers})


class SupervisedRun(Protocol):
    """What a supervisor reads of the run it drives: fixed when the run is launched."""

    run_id: str
    client: Client
    store: RunStore
    spec: RunSpec
    corpus: NameCorpus
    on_metrics: Callable[[dict[str, Any]], None] | None
    pg_timeout_s: float
    reservation: str | None
    resume: Resume | None
    global_batch: int

    @property
    def topic(self) -> str: ...

    @property
    def cancel_name(self) -> str: ...

    @property
    def snapshot_queue(self) -> str: ...
