"""Continue a stopped run (failed, cancelled, interrupted or finished) from its latest snapshot.

The continuation is a new run linked to the old one (``resumed_from``), with the old run's settings
unless overridden, its global batch whatever the new worker count, and the old run's curves up to
the snapshot copied over, so the new run's charts read as one run from step 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from petmodel.config import RunSpec
from petmodel.errors import PetmodelError, UsageError
from petmodel.store import ACTIVE_STATUSES, RunStore
from petmodel.store.owners import DEFAULT_STALE_RUN_S, STALE_RUN_ENV, describe_owner, live_here
from petmodel.trainstate import TrainState, load_state


@dataclass(frozen=True)
class Resume:
    """Where a new run starts: the old run's id, its snapshot, and the snapshot's bytes (to ship to ranks)."""

    run_id: str
    state: TrainState
    blob: bytes


def resumable(store: RunStore, run_id: str) -> bool:
    """Whether ``run_id`` has stopped and left a snapshot to continue from (what shows a Resume button)."""
    run = store.get_run(run_id)
    return run is not None and run.status not in ACTIVE_STATUSES and store.state_path(run_id).is_file()


def prepare_resume(store: RunStore, run_id: str, **overrides: Any) -> tuple[RunSpec, Resume]:
    """The spec and snapshot that continue ``run_id``; ``overrides`` as for :meth:`RunSpec.with_`.

    Raises PetmodelError, one sentence, when the run cannot be continued (unknown, still running,
    no snapshot, or nothing left to train under its settings).
    """
    run = store.get_run(run_id)
    if run is None:
        raise PetmodelError(f"No run called {run_id!r} in the store {store.root}; list runs with "
                            "`python -m petmodel runs`.")
    if run.status in ACTIVE_STATUSES:
        if live_here(run.owner) is None:  # its driver is on another host (or gone): say when that ends
            raise PetmodelError(f"Run {run_id} is still {run.status} ({describe_owner(run.owner)}); cancel it where "
                                "it runs, or if its driver is gone resume it once it has been silent for "
                                f"${STALE_RUN_ENV} seconds (default {DEFAULT_STALE_RUN_S:g}), when it is marked "
                                "failed.")
        raise PetmodelError(f"Run {run_id} is still {run.status}; cancel it or wait for it to end before resuming it.")
    path = store.state_path(run_id)
    if not path.is_file():
        raise PetmodelError(f"Run {run_id} left no training snapshot (it stopped before its first one, or was "
                            "trained by an older petmodel); train it again instead.")
    state, blob = load_state(path)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    overrides.setdefault("note", run.note)  # the note as it reads now (`runs note` edits the store's, not the config's)
    try:
        spec = RunSpec.from_dict(run.config)
        workers = overrides.get("workers", spec.workers)
        # The global batch is the run's: the per-worker batch follows the new worker count.
        overrides.setdefault("batch_size", max(1, state.global_batch // max(1, workers)))
        spec = spec.with_(**overrides)
    except (TypeError, ValueError) as err:
        raise UsageError(f"Cannot resume run {run_id} with these settings: {err}") from None
    t = spec.train
    if t.max_steps is not None and state.step >= t.max_steps:
        raise UsageError(f"Run {run_id} already trained its {t.max_steps} steps; give it more steps.")
    if t.epochs is not None and state.epoch >= t.epochs:  # epochs count from the run's start, whatever the budget
        raise UsageError(f"Run {run_id} already trained its {t.epochs} epoch(s); give it more epochs (--epochs on "
                         "the command line).")
    return spec, Resume(run_id=run_id, state=state, blob=blob)


def link_resumed(store: RunStore, new_run_id: str, resume: Resume) -> None:
    """Mark ``new_run_id`` as the continuation and copy the old run's metrics up to the snapshot."""
    store.update_run(new_run_id, resumed_from=resume.run_id)
    store.copy_metrics(resume.run_id, new_run_id, up_to_step=resume.state.step)
