"""The run supervisor's decisions, without a cluster: a table of ranks' statuses → what the run does next.

:func:`petmodel.cluster.failure_policy.decide` is pure, so every row is a hand-made
:class:`~petmodel.cluster.failures.GroupStatus`; the sentences a user reads are asserted word for word.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from petmodel.app.pending import CANCELLED, PendingLaunch
from petmodel.cluster.calls import NoAnswer, require_answers
from petmodel.cluster.failure_policy import Action, Decision, decide, final_status
from petmodel.cluster.failures import (FailureKind, GroupStatus, RankError, RankFailure, crash_failure, error_summary,
                                       failure_sentence)
from petmodel.errors import LaunchCancelled, PetmodelError, WorkerCallFailed, WorkerSilent
from petmodel.status import RunStatus

REPO = Path(__file__).resolve().parents[1]
A, B, C = "tcp://10.0.0.1:4001", "tcp://10.0.0.2:4002", "tcp://10.0.0.3:4003"

LOST_B = RankFailure(FailureKind.LOST, 1, B)
FROZEN_B = RankFailure(FailureKind.FROZEN, 1, B)
CRASH_A = RankFailure(FailureKind.CRASHED, 0, A, "ValueError: bad batch")
OOM_C = RankFailure(FailureKind.OUT_OF_MEMORY, 2, C, "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")

LOST_SENTENCE = (f"Worker {B} (rank 1) left the cluster mid-run (its process died or was killed); "
                 "the other ranks were stopped.")
FROZEN_SENTENCE = (f"Worker {B} (rank 1) stopped answering mid-run (frozen or overloaded); "
                   "the other ranks were stopped.")
CRASH_SENTENCE = f"Rank 0 on worker {A} failed (ValueError: bad batch); the other ranks were stopped."
OOM_SENTENCE = (f"Rank 2 on worker {C} ran out of memory (OutOfMemoryError: CUDA out of memory. Tried to allocate "
                "2.00 GiB); the other ranks were stopped; try a smaller batch size or model.")
CANCEL_TIMEOUT_SENTENCE = "Some ranks did not stop in time after the run was cancelled."


def ended(*, failure: RankFailure | None = None, left: set[int] = frozenset(), frozen: set[int] = frozenset(),
          pending: set[int] = frozenset(), ranks: int = 3) -> GroupStatus:
    """A formation of ``ranks`` that has ended: ranks in ``pending`` had not returned (abandoned)."""
    states = tuple("pending" if r in pending else "error" if failure and r == failure.rank else "finished"
                   for r in range(ranks))
    return GroupStatus(states=states, done=frozenset(range(ranks)) - set(pending), left=frozenset(left),
                       frozen=frozenset(frozen), failure=failure, all_done=True, ended=True)


def running(*, failure: RankFailure | None = None, all_done: bool = False) -> GroupStatus:
    return GroupStatus(states=("pending", "pending"), failure=failure, all_done=all_done)


# (what the ended formation looked like, restarts so far, max_restarts, cancel requested) → decision
ENDED_ROWS = [
    pytest.param(ended(failure=LOST_B, left={1}, pending={1}), 0, 2, False,
                 Decision(Action.REFORM, LOST_B, LOST_SENTENCE, lost=(1,), survivors=(0, 2)), id="lost-restarts-left"),
    pytest.param(ended(failure=LOST_B, left={1}, pending={1}), 2, 2, False,
                 Decision(Action.FAIL, LOST_B, f"Worker {B} (rank 1) left the cluster mid-run (its process died or was "
                                               "killed); the run had already re-formed 2× (its max_restarts)."),
                 id="lost-none-left"),
    pytest.param(ended(failure=LOST_B, left={1}, pending={1}), 0, 0, False,
                 Decision(Action.FAIL, LOST_B, LOST_SENTENCE), id="lost-never-restarts"),
    pytest.param(ended(failure=LOST_B, left={0, 1}, pending={0, 1}), 1, 3, False,
                 Decision(Action.REFORM, LOST_B, LOST_SENTENCE, lost=(0, 1), survivors=(2,)), id="two-lost"),
    pytest.param(ended(failure=FROZEN_B, frozen={1}, pending={1}), 0, 1, False,
                 Decision(Action.REFORM, FROZEN_B, FROZEN_SENTENCE, lost=(1,), survivors=(0, 2)), id="frozen-peer"),
    pytest.param(ended(failure=CRASH_A), 0, 3, False, Decision(Action.FAIL, CRASH_A, CRASH_SENTENCE), id="crashed"),
    pytest.param(ended(failure=CRASH_A), 1, 1, False, Decision(Action.FAIL, CRASH_A, CRASH_SENTENCE),
                 id="crashed-after-a-re-form-says-nothing-of-restarts"),
    pytest.param(ended(failure=OOM_C), 0, 3, False, Decision(Action.FAIL, OOM_C, OOM_SENTENCE), id="out-of-memory"),
    pytest.param(ended(), 0, 2, True, Decision(Action.FINISH), id="cancelled-ranks-returned"),
    pytest.param(ended(failure=LOST_B, left={1}, pending={1}), 0, 2, True,
                 Decision(Action.FAIL, LOST_B, LOST_SENTENCE), id="cancel-never-re-forms"),
    pytest.param(ended(pending={0, 2}), 0, 2, True,
                 Decision(Action.FAIL, RankFailure(FailureKind.CANCEL_TIMEOUT), CANCEL_TIMEOUT_SENTENCE),
                 id="cancel-timeout"),
    pytest.param(ended(), 0, 2, False, Decision(Action.FINISH), id="all-done"),
    pytest.param(ended(), 2, 2, False, Decision(Action.FINISH), id="all-done-after-re-forms"),
]


@pytest.mark.parametrize("status, restarts, max_restarts, cancel, expected", ENDED_ROWS)
def test_an_ended_formation(status: GroupStatus, restarts: int, max_restarts: int, cancel: bool,
                            expected: Decision) -> None:
    assert decide(status, restarts=restarts, max_restarts=max_restarts, cancel_requested=cancel) == expected


# (status while ranks run, cancel requested, seconds since the ranks were told to stop) → action
RUNNING_ROWS = [
    pytest.param(running(), False, None, Action.CONTINUE, id="healthy"),
    pytest.param(running(failure=LOST_B), False, None, Action.STOP_RANKS, id="failure-stops-the-others"),
    pytest.param(running(), True, None, Action.STOP_RANKS, id="cancel-stops-every-rank"),
    pytest.param(running(failure=LOST_B), False, 39.0, Action.CONTINUE, id="failure-within-grace"),
    pytest.param(running(failure=LOST_B), False, 41.0, Action.END, id="failure-grace-over"),
    pytest.param(running(), True, 14.0, Action.CONTINUE, id="cancel-within-grace"),
    pytest.param(running(), True, 16.0, Action.END, id="cancel-grace-over"),
    pytest.param(running(all_done=True), False, None, Action.END, id="all-done"),
    pytest.param(running(failure=FROZEN_B, all_done=True), False, 1.0, Action.END, id="all-done-but-the-frozen"),
]


@pytest.mark.parametrize("status, cancel, stopping_for_s, action", RUNNING_ROWS)
def test_a_running_formation(status: GroupStatus, cancel: bool, stopping_for_s: float | None, action: Action) -> None:
    decision = decide(status, restarts=0, max_restarts=2, cancel_requested=cancel, stopping_for_s=stopping_for_s,
                      grace_s=40.0, cancel_grace_s=15.0)
    assert decision == Decision(action)


@pytest.mark.parametrize("cancel, stopped_by, asked, expected", [
    (True, "cancel", RunStatus.CANCELLED, RunStatus.CANCELLED),
    (True, "cancel", RunStatus.PRUNED, RunStatus.PRUNED),
    (True, "steps", RunStatus.CANCELLED, RunStatus.COMPLETED),  # it finished before the cancel reached it
    (False, "time", RunStatus.CANCELLED, RunStatus.COMPLETED),
])
def test_how_a_run_whose_ranks_returned_ends(cancel: bool, stopped_by: str, asked: RunStatus,
                                             expected: RunStatus) -> None:
    assert final_status(cancel, stopped_by, asked) is expected


@pytest.mark.parametrize("failure, restarts, max_restarts, sentence", [
    (LOST_B, 0, None, LOST_SENTENCE),
    (LOST_B, 1, 3, LOST_SENTENCE),  # restarts left: the others were stopped, it re-forms
    (LOST_B, 3, 3, f"Worker {B} (rank 1) left the cluster mid-run (its process died or was killed); "
                   "the run had already re-formed 3× (its max_restarts)."),
    (LOST_B, 0, 0, LOST_SENTENCE),  # never allowed to re-form: nothing to say about restarts
    (FROZEN_B, 1, 1, f"Worker {B} (rank 1) stopped answering mid-run (frozen or overloaded); "
                     "the run had already re-formed 1× (its max_restarts)."),
    (FROZEN_B, 0, None, FROZEN_SENTENCE),
    (CRASH_A, 0, None, CRASH_SENTENCE),
    (OOM_C, 0, None, OOM_SENTENCE),
    (RankFailure(FailureKind.CANCEL_TIMEOUT), 2, 2, CANCEL_TIMEOUT_SENTENCE),
    (RankFailure(FailureKind.START_FAILED, detail="Worker x did not answer"), 0, None,
     "Could not start the run: Worker x did not answer"),
    (RankFailure(FailureKind.MONITOR_FAILED, detail="database is locked"), 0, None,
     "The run's monitor failed: database is locked."),
])
def test_failure_sentences(failure: RankFailure, restarts: int, max_restarts: int | None, sentence: str) -> None:
    assert failure_sentence(failure, restarts, max_restarts) == sentence


class OutOfMemoryError(RuntimeError):
    """Named like torch.cuda.OutOfMemoryError: detection goes by the type's name."""


@pytest.mark.parametrize("exc, kind", [
    (OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"), FailureKind.OUT_OF_MEMORY),
    (MemoryError(), FailureKind.OUT_OF_MEMORY),
    (RuntimeError("CUDA error: out of memory"), FailureKind.OUT_OF_MEMORY),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to "
                  "allocate 123 bytes."), FailureKind.OUT_OF_MEMORY),
    (RuntimeError("Connection closed by peer"), FailureKind.CRASHED),
    (ValueError("memory layout is wrong"), FailureKind.CRASHED),
])
def test_a_rank_error_is_typed_by_its_exception(exc: BaseException, kind: FailureKind) -> None:
    error = RankError(1, type(exc).__name__, error_summary(exc))
    assert crash_failure(error, B) == RankFailure(kind, 1, B, error.summary)


def test_an_error_summary_is_one_line_of_at_most_300_characters() -> None:
    assert error_summary(ValueError("first line\nsecond line")) == "ValueError: first line"
    assert error_summary(None) == "unknown error"
    assert error_summary(RuntimeError("x" * 500)) == "RuntimeError: " + "x" * 286


def test_first_line_quotes_one_line_of_an_error_and_names_an_empty_one() -> None:
    from petmodel.errors import first_line

    assert first_line(ValueError("  first line.\nsecond line")) == "first line."
    assert first_line(KeyError()) == "KeyError"  # no message: the type's name
    assert first_line(OSError("\nboom\nmore"), typed=True) == "OSError: boom"
    assert first_line(RuntimeError("x" * 50), typed=True, limit=20) == "RuntimeError: xxxxxx"


def test_unanswered_calls_raise_types_with_the_same_sentences() -> None:
    with pytest.raises(WorkerSilent) as silent:
        require_answers({A: NoAnswer(A, "timeout")}, 4, "reporting its package versions")
    assert str(silent.value) == (f"Worker {A} did not answer within 4 s while reporting its package versions "
                                 "(frozen or overloaded); restart or remove it and try again.")
    with pytest.raises(WorkerCallFailed) as failed:
        require_answers({A: 1, B: NoAnswer(B, "OSError: gone")}, 4, "checking its petmodel code")
    assert str(failed.value) == f"Worker {B} failed while checking its petmodel code (OSError: gone); check its log."
    assert isinstance(failed.value, PetmodelError)
    require_answers({A: 1, B: {"hash": "x"}}, 4, "anything")  # every worker answered: nothing raised


def _launch_ending(err: PetmodelError, *, cancel: bool) -> str:
    pending = PendingLaunch(id="launch-test", label="test")

    def start(on_queue, cancel_event: threading.Event, on_scale) -> str:
        if cancel:
            cancel_event.set()
        raise err

    pending._run(start)
    return pending.status().state


def test_a_waiting_launch_is_cancelled_by_the_exception_type_not_its_wording() -> None:
    assert _launch_ending(LaunchCancelled(CANCELLED), cancel=True) == "cancelled"
    assert _launch_ending(PetmodelError(CANCELLED), cancel=True) == "failed"  # same words, not a cancel
    assert _launch_ending(LaunchCancelled(CANCELLED), cancel=False) == "failed"  # the user never asked


def test_the_policy_needs_no_cluster_and_no_torch() -> None:
    code = ("import sys, petmodel.cluster.failure_policy, petmodel.cluster.failures; "
            "print('distributed' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
