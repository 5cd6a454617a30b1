"""Why a cluster run failed, as types; the one sentence a user reads is written last, from the type.

Code decides on :class:`RankFailure` (its :class:`FailureKind`), never on the wording of a message:
:mod:`petmodel.cluster.failure_policy` re-forms a run on a lost or frozen worker and fails it on
anything else, and :func:`failure_sentence` alone turns a failure into the sentence that is stored
as the run's error, so rewording a sentence cannot change what the supervisor does.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from petmodel.compat import client_running, is_out_of_memory  # is_out_of_memory re-exported: a text test, in compat
from petmodel.errors import first_line

__all__ = ["FailureKind", "GroupStatus", "RankError", "RankFailure", "crash_failure", "error_summary",
           "failure_sentence", "is_out_of_memory"]


class FailureKind(StrEnum):
    """What went wrong with a run's ranks."""

    LOST = "lost"  # a worker left the cluster (its process died or was killed)
    FROZEN = "frozen"  # a worker is still in the cluster but stopped answering
    CRASHED = "crashed"  # a rank raised a Python error
    OUT_OF_MEMORY = "out_of_memory"  # a rank raised an out-of-memory error
    CANCEL_TIMEOUT = "cancel_timeout"  # after a cancel, some ranks did not stop within the grace period
    START_FAILED = "start_failed"  # the ranks could not be submitted
    MONITOR_FAILED = "monitor_failed"  # the client-side supervisor itself raised
    SCHEDULER_LOST = "scheduler_lost"  # the client lost the Dask scheduler (killed, restarted or not answering)


@dataclass(frozen=True)
class RankError:
    """What one rank raised, summarised on the client: its type's name and a one-line text."""

    rank: int
    type_name: str
    summary: str  # "TypeName: message", first line, at most 300 characters


@dataclass(frozen=True)
class RankFailure:
    """One failure of a run: its kind, the rank and worker to blame (when there is one), the detail."""

    kind: FailureKind
    rank: int | None = None
    worker: str | None = None
    detail: str = ""  # the exception's summary (crashed, out of memory) or the error (start, monitor)


@dataclass(frozen=True)
class GroupStatus:
    """The ranks of one formation at one moment, as :class:`~petmodel.cluster.rank_group.RankGroup` saw them.

    What :func:`~petmodel.cluster.failure_policy.decide` reads: a plain value, so the policy needs no cluster.
    """

    states: tuple[str, ...]  # each rank's Dask task state: pending, finished, error, cancelled or lost
    done: frozenset[int] = frozenset()  # ranks whose task has ended (finished, failed or cancelled)
    errors: tuple[RankError, ...] = ()  # what a rank that raised said (fetched for the first one only)
    left: frozenset[int] = frozenset()  # ranks whose worker left the cluster
    frozen: frozenset[int] = frozenset()  # ranks whose worker is in the cluster but does not answer
    failure: RankFailure | None = None  # the first failure seen in this formation: its root cause
    all_done: bool = False  # every rank whose worker is still there has ended
    ended: bool = False  # the formation is over: ranks still running were abandoned (cancelled)

    @property
    def gone(self) -> frozenset[int]:
        """Ranks whose task may never end: their worker left or froze. A re-form goes on without them."""
        return self.left | self.frozen

    @property
    def pending(self) -> tuple[int, ...]:
        """Ranks whose task had not ended."""
        return tuple(r for r in range(len(self.states)) if r not in self.done)

    @property
    def survivors(self) -> tuple[int, ...]:
        """Ranks whose worker is still there and answering."""
        return tuple(r for r in range(len(self.states)) if r not in self.gone)


def error_summary(exc: BaseException | None) -> str:
    """``"TypeName: message"`` on one line of at most 300 characters (what a run's error quotes)."""
    return first_line(exc, typed=True, limit=300) if exc is not None else "unknown error"


def crash_failure(error: RankError, worker: str) -> RankFailure:
    """The failure of a rank that raised on a healthy worker: out of memory, or any other crash."""
    kind = FailureKind.OUT_OF_MEMORY if is_out_of_memory(error.type_name, error.summary) else FailureKind.CRASHED
    return RankFailure(kind, error.rank, worker, error.summary)


def failure_sentence(failure: RankFailure, restarts: int = 0, max_restarts: int | None = None) -> str:
    """The one sentence stored as the run's error (and as the reason in its ``lost_workers``).

    ``max_restarts``: given only where the run would have re-formed but its restarts ran out; once it
    has re-formed at all, the sentence then says so instead of "the other ranks were stopped".
    """
    exhausted = max_restarts is not None and 0 < restarts and max_restarts <= restarts
    tail = (f"the run had already re-formed {restarts}× (its max_restarts)" if exhausted
            else "the other ranks were stopped")
    rank, worker, kind = failure.rank, failure.worker, failure.kind
    if kind is FailureKind.LOST:
        return f"Worker {worker} (rank {rank}) left the cluster mid-run (its process died or was killed); {tail}."
    if kind is FailureKind.FROZEN:
        return f"Worker {worker} (rank {rank}) stopped answering mid-run (frozen or overloaded); {tail}."
    if kind is FailureKind.OUT_OF_MEMORY:
        return (f"Rank {rank} on worker {worker} ran out of memory ({failure.detail}); {tail}; "
                "try a smaller batch size or model.")
    if kind is FailureKind.CRASHED:
        return f"Rank {rank} on worker {worker} failed ({failure.detail}); {tail}."
    if kind is FailureKind.CANCEL_TIMEOUT:
        return "Some ranks did not stop in time after the run was cancelled."
    if kind is FailureKind.START_FAILED:
        return f"Could not start the run: {failure.detail}"
    if kind is FailureKind.SCHEDULER_LOST:
        return (f"Lost the Dask scheduler{f' at {worker}' if worker else ''} (it stopped, restarted or stopped "
                f"answering); {failure.detail}")
    return f"The run's monitor failed: {failure.detail}."


def lost_the_scheduler(err: BaseException, client: Any) -> bool:
    """Whether the supervisor's error means the scheduler is gone rather than a bug of ours.

    Decided on types and the client's own state, not on Dask's message text: a client that is no longer
    running (reconnecting or closed; ``None`` when there is none to ask), a cancelled future (Dask cancels
    every future when its client loses the scheduler), a closed comm (an OSError) or a call that timed out
    (a frozen scheduler).
    """
    import concurrent.futures

    if getattr(client, "status", None) is not None and not client_running(client):
        return True
    return isinstance(err, (concurrent.futures.CancelledError, OSError, TimeoutError))
