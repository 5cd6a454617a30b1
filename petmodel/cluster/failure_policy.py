"""What a run does next, given its ranks' status: a pure function, testable without a cluster.

The supervisor polls its :class:`~petmodel.cluster.rank_group.RankGroup` into a frozen
:class:`~petmodel.cluster.failures.GroupStatus` and asks :func:`decide`. While the formation runs
the answer is to keep watching, to tell every rank to stop (a failure, or a cancel), or to end
the formation (every rank is done, or the stopped ranks had their grace period). Once it has
ended: finish, re-form on the surviving ranks (a worker left or froze and restarts are left), or
fail with a typed reason and its sentence. No Dask, no I/O, no clock: the caller passes time in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from petmodel.cluster.failures import FailureKind, GroupStatus, RankFailure, failure_sentence
from petmodel.status import RunStatus, StopReason

CANCEL_GRACE_S = 15.0  # after a cancel, ranks that have not stopped by then are abandoned
FAILURE_GRACE_S = 40.0  # after a failure (the supervisor passes its process-group timeout + 10 s)


class Action(StrEnum):
    CONTINUE = "continue"  # keep watching the ranks
    STOP_RANKS = "stop_ranks"  # tell every rank to stop, then keep watching until they have
    END = "end"  # end this formation (abandon ranks still running), then decide again
    FINISH = "finish"  # the ranks returned: record the result (completed, or cancelled)
    REFORM = "reform"  # start again from the newest snapshot on the surviving ranks' workers
    FAIL = "fail"  # the run failed: ``failure`` says why, ``sentence`` says it to the user


@dataclass(frozen=True)
class Decision:
    action: Action
    failure: RankFailure | None = None
    sentence: str | None = None  # the run's error (FAIL), or why it re-forms (REFORM)
    lost: tuple[int, ...] = ()  # REFORM: the ranks left behind
    survivors: tuple[int, ...] = ()  # REFORM: the ranks whose workers the run re-forms on


def decide(status: GroupStatus, *, restarts: int, max_restarts: int, cancel_requested: bool,
           stopping_for_s: float | None = None, grace_s: float = FAILURE_GRACE_S,
           cancel_grace_s: float = CANCEL_GRACE_S) -> Decision:
    """The next step for a run whose ranks are in ``status``.

    ``restarts``: times the run has re-formed so far; ``stopping_for_s``: seconds since the ranks were
    told to stop (None: not yet). A worker that left or froze re-forms the run, unless it was
    cancelled or has re-formed ``max_restarts`` times; any other failure fails it.
    """
    failure = status.failure
    if not status.ended:
        if status.all_done:
            return Decision(Action.END)
        if stopping_for_s is None:
            return Decision(Action.STOP_RANKS if failure is not None or cancel_requested else Action.CONTINUE)
        over = stopping_for_s > (grace_s if failure is not None else cancel_grace_s)
        return Decision(Action.END if over else Action.CONTINUE)
    if failure is None and status.pending:
        failure = RankFailure(FailureKind.CANCEL_TIMEOUT)  # only a cancel stops ranks without a failure
    if failure is None:
        return Decision(Action.FINISH)
    if not status.gone or cancel_requested:
        return Decision(Action.FAIL, failure, failure_sentence(failure))
    if restarts >= max_restarts:
        return Decision(Action.FAIL, failure, failure_sentence(failure, restarts, max_restarts))
    return Decision(Action.REFORM, failure, failure_sentence(failure), lost=tuple(sorted(status.gone)),
                    survivors=status.survivors)


def final_status(cancel_requested: bool, stopped_by: StopReason, cancel_status: RunStatus) -> RunStatus:
    """How a run whose ranks returned ends: as its cancel asked (cancelled, pruned), when rank 0
    stopped for it, else completed (a cancel that came after the run had finished changes nothing)."""
    return cancel_status if cancel_requested and stopped_by == StopReason.CANCEL else RunStatus.COMPLETED
