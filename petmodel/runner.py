"""Train in this process and record the run in the store: the path without a cluster.

The same steps as a cluster run (create run → train → best checkpoint → final status), so the
store, the CLI and the app see both kinds of run the same way.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from petmodel.checkpoint import Checkpoint, save_checkpoint
from petmodel.data import NameCorpus, load_corpus
from petmodel.errors import PetmodelError, UsageError
from petmodel.config import RunSpec, counted
from petmodel.precision import check_precision, local_device
from petmodel.status import RunStatus, StopReason
from petmodel.store import RunStore, current_owner, metric_record
from petmodel.train import TrainResult, train_model
from petmodel.trainstate import TrainState, save_state_bytes

if TYPE_CHECKING:
    from petmodel.resume import Resume

log = logging.getLogger(__name__)


def corpus_meta(corpus: NameCorpus) -> dict[str, Any]:
    return {"data_source": corpus.source, "rows": corpus.rows, "kept": corpus.kept, "dropped": corpus.dropped,
            "train_names": len(corpus.train_names), "val_names": len(corpus.val_names),
            "species": corpus.species_counts()}


def check_run_fits(spec: RunSpec, corpus: NameCorpus) -> None:
    """Refuse, before a run is recorded, a global batch the training names cannot fill."""
    if spec.global_batch > len(corpus.train_names):
        workers = max(1, spec.workers)
        raise UsageError(f"The global batch ({spec.train.batch_size} per worker × {counted(workers, 'worker')} = "
                         f"{spec.global_batch}) is larger than the "
                         f"{len(corpus.train_names):,} training names; use a smaller batch.")


def save_snapshot(store: RunStore, run_id: str, spec: RunSpec, state: TrainState | bytes | None) -> None:
    """Write a run's training snapshot (an object, or the bytes a rank sent) atomically into the store."""
    if state is None:
        return
    if isinstance(state, TrainState):
        state.spec = spec.to_dict()
        state = state.to_bytes()
    save_state_bytes(store.state_path(run_id), state)


def save_snapshot_quietly(store: RunStore, run_id: str, spec: RunSpec, state: TrainState | bytes | None) -> bool:
    """:func:`save_snapshot` for the periodic ones: a failed save (a full disk) is logged, not fatal.

    Training goes on, and a lost worker or a resume falls back to the last snapshot that was saved.
    """
    try:
        save_snapshot(store, run_id, spec, state)
    except (PetmodelError, OSError) as err:
        log.warning("run %s: could not save a training snapshot (%s); training goes on", run_id, err)
        return False
    return True


def start_record(store: RunStore, spec: RunSpec, *, resume: Resume | None = None, **fields: Any) -> str:
    """Create a run's store row (running, owned by this process), linked to the run it resumes.

    Its name is ``name`` or the spec's, else the store makes one from its settings; its note the spec's.
    """
    run_id = store.create_run(spec.to_dict(), name=fields.pop("name", spec.name), kind=fields.pop("kind", "train"),
                              study_id=fields.pop("study_id", None), status=RunStatus.RUNNING, owner=current_owner(),
                              note=spec.note)
    store.update_run(run_id, started=time.time(), **fields)
    if resume is not None:
        from petmodel.resume import link_resumed

        link_resumed(store, run_id, resume)
    return run_id


def finish_run(store: RunStore, run_id: str, spec: RunSpec, corpus: NameCorpus, result: TrainResult,
               *, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Save the best checkpoint and mark the run completed; returns the run's result dict."""
    if not math.isfinite(result.best_val_nll):
        raise PetmodelError("Training stopped before the first validation; give it more time or epochs.")
    path = store.checkpoint_path(run_id)
    meta = {"run_id": run_id, "spec": spec.to_dict(), "val_nll": result.best_val_nll,
            "train_seconds": result.train_seconds, "samples": result.global_samples,
            "created": time.time(), **corpus_meta(corpus)}
    model_config = spec.model_config(corpus.alphabet.vocab_size).for_data(corpus.has_species)  # as train_model
    save_checkpoint(path, Checkpoint(model_config, corpus.alphabet, result.best_state, meta,
                                     frozenset(corpus.train_names)))
    out = {"run_id": run_id, "status": RunStatus.COMPLETED, "val_nll": round(result.best_val_nll, 4),
           "final_val_nll": round(result.final_val_nll, 4), "train_seconds": round(result.train_seconds, 2),
           "samples": result.global_samples, "steps": result.steps, "stopped_by": result.stopped_by,
           "model_path": str(path), "data": corpus_meta(corpus), **(extra or {})}
    store.update_run(run_id, status=RunStatus.COMPLETED, finished=time.time(), train_seconds=result.train_seconds,
                     samples=result.global_samples, val_nll=result.best_val_nll, best_val_nll=result.best_val_nll,
                     model_path=str(path), result=out)
    return out


@dataclass
class MetricsBuffer:
    """Collects metric rows and writes them to the store in batches (one transaction per flush)."""

    store: RunStore
    run_id: str
    every: float = 0.5
    _rows: list[dict[str, Any]] | None = None
    _last: float = 0.0

    def __call__(self, row: dict[str, Any]) -> None:
        if self._rows is None:
            self._rows = []
        self._rows.append(metric_record(row))
        if row.get("kind") == "val" or time.monotonic() - self._last > self.every:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self.store.add_metrics(self.run_id, self._rows)
            self._rows = []
        self._last = time.monotonic()


def train_in_process(spec: RunSpec, store: RunStore, *, corpus: NameCorpus | None = None,
                     on_metrics: Callable[[dict[str, Any]], None] | None = None,
                     should_stop: Callable[[], bool] | None = None, resume: Resume | None = None) -> dict[str, Any]:
    """Run ``spec`` here (no cluster), recording it in ``store``; returns the result dict.

    A snapshot of the training state is saved every ``checkpoint_every_s`` and when training stops
    (``should_stop`` is how Ctrl-C stops it cleanly); ``resume`` continues another run's snapshot.
    """
    device = local_device()
    check_precision(spec.train.precision, device)  # before anything is recorded: this CPU may have no bf16
    corpus = corpus or load_corpus(spec.data)
    check_run_fits(spec, corpus)
    run_id = start_record(store, spec, resume=resume, backend="local", workers=["local"], hosts=["localhost"])
    buffer = MetricsBuffer(store, run_id)

    def sink(row: dict[str, Any]) -> None:
        buffer(row)
        if on_metrics:
            on_metrics(row)

    try:
        from petmodel.tracking import Tracker

        with Tracker(spec, run_id, store.root) as tracker:
            train_data, val_data = corpus.encode_splits()
            result = train_model(spec.model_config(corpus.alphabet.vocab_size), spec.train, train_data, val_data,
                                 device=device,
                                 on_metrics=lambda r: (sink(r), tracker.log(r)), should_stop=should_stop,
                                 resume=resume.state if resume else None,
                                 on_checkpoint=lambda state: save_snapshot_quietly(store, run_id, spec, state))
            buffer.flush()
            save_snapshot_quietly(store, run_id, spec, result.state)
            if result.stopped_by == StopReason.CANCEL:
                store.update_run(run_id, status=RunStatus.CANCELLED, finished=time.time(), error="Cancelled by the user.")
                return {"run_id": run_id, "status": RunStatus.CANCELLED}
            out = finish_run(store, run_id, spec, corpus, result, extra={"workers": 0, "backend": "local",
                                                                           "global_batch": spec.global_batch})
            tracker.finish(out, store.checkpoint_path(run_id))
            return out
    except KeyboardInterrupt:
        _record_end(store, buffer, run_id, RunStatus.CANCELLED, "Interrupted.")
        raise
    except BaseException as err:
        _record_end(store, buffer, run_id, RunStatus.FAILED, str(err) or type(err).__name__)
        raise


def _record_end(store: RunStore, buffer: MetricsBuffer, run_id: str, status: RunStatus, error: str) -> None:
    """Record how a run ended, best effort: on a full disk the write may fail too, and the original
    error is the one the user must see (a later ``reconcile_orphans`` tidies what is left)."""
    try:
        buffer.flush()
    except PetmodelError:
        pass
    try:
        store.update_run(run_id, status=status, finished=time.time(), error=error)
    except PetmodelError:
        pass
