"""The states a run passes through, as ``str`` enums: a run's or study's status (``RunStatus``), a rank's state
in the rank table (``RankState``) and why a training loop stopped (``StopReason``).

A ``StrEnum`` member *is* its string (``RunStatus.COMPLETED == "completed"``), so the values the
run store keeps and the JSON the CLI prints do not change, while code names a status once and a
typo fails at import instead of silently matching nothing.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run (or a study) stands. A study's items use the same values."""

    QUEUED = "queued"  # recorded, not started (a study's planned row)
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # stopped by the user (or by the study it belongs to)
    PRUNED = "pruned"  # stopped early by a hyperparameter search

    @property
    def finished(self) -> bool:
        """Whether the run has ended and its record is final."""
        return self in FINISHED

    @property
    def active(self) -> bool:
        return self in ACTIVE


class RankState(StrEnum):
    """A rank's state as the rank table shows it (from its Dask task's status, or the run's record once it ended)."""

    STARTING = "starting"  # its task runs, no step reported yet
    TRAINING = "training"
    DONE = "done"
    FAILED = "failed"  # the rank whose failure ended the run
    STOPPED = "stopped"  # stopped because another rank failed, or pruned
    CANCELLED = "cancelled"
    LOST = "lost"  # its worker left the cluster


class StopReason(StrEnum):
    """Why a training loop stopped (``stopped_by`` in ``train --json``): the limit it reached, or a stop request."""

    EPOCHS = "epochs"  # the epochs asked for are done
    TIME = "time"  # the time budget ran out
    STEPS = "steps"  # the step limit (mostly tests)
    CANCEL = "cancel"  # asked to stop (the user, a study, a re-form)


FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.PRUNED})
ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING)
