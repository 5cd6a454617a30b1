"""The run fields every ``--json`` result carries, built in one place from the store's record.

``train --json`` and each row of ``runs --json`` start from :func:`run_row`, so the same run
reads the same in both (its ``workers``, ``where``, ``resumed_from``, ``restarts``,
``lost_workers``), whether it trained in-process or on a cluster. The shapes are declared in
:mod:`petmodel.cli.json_schema`; :func:`json_line` prints them as strict JSON.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from petmodel.analysis import rounded, run_where, run_workers
from petmodel.step_breakdown import step_time_summary
from petmodel.status import RunStatus

if TYPE_CHECKING:
    from petmodel.store import RunRecord, RunStore

__all__ = ["json_line", "run_row", "train_row"]

# What only the end of training knows (the run's ``result``); null for a run that did not complete.
TRAIN_RESULT_KEYS = ("final_val_nll", "steps", "stopped_by", "samples_per_s", "torch_threads", "data")


def best_val_nll(store: RunStore, run: RunRecord) -> float | None:
    """The run's headline NLL: the store's, else (a run that did not complete) its best validation point."""
    if run.nll is not None or run.status == RunStatus.COMPLETED:
        return run.nll
    points = [row["val_nll"] for row in store.metrics(run.id, kind="val") if row.get("val_nll") is not None]
    finite = [float(v) for v in points if math.isfinite(float(v))]
    return min(finite) if finite else None


def run_row(store: RunStore, run: RunRecord) -> dict[str, Any]:
    """One run as every ``--json`` result shows it (:data:`petmodel.cli.json_schema.RUN_FIELDS`)."""
    result = run.result or {}
    config = run.config or {}
    where = run_where(run)
    global_batch = result.get("global_batch", config.get("global_batch"))
    return {
        "run_id": run.id, "name": run.name, "note": run.note, "status": str(run.status), "kind": run.kind,
        "study_id": run.study_id,
        "created": run.created, "started": run.started, "finished": run.finished,
        "workers": run_workers(run), "where": where, "backend": run.backend,
        "worker_addresses": [] if where == "in-process" else [w for w in run.workers if w != "local"],
        "hosts": list(run.hosts), "global_batch": int(global_batch) if global_batch is not None else None,
        "val_nll": rounded(best_val_nll(store, run), 4), "train_seconds": rounded(run.train_seconds, 2),
        "samples": run.samples, "error": run.error, "failed_worker": run.failed_worker,
        "model_path": run.model_path, "resumed_from": run.resumed_from, "restarts": int(run.restarts or 0),
        "lost_workers": [dict(w) for w in run.lost_workers],
        "step_time": step_time_summary(store.step_time_rows([run.id]).get(run.id, [])),
    }


def train_row(store: RunStore, run_id: str, result: dict[str, Any]) -> dict[str, Any]:
    """``train --json``: the run's row, then what its end of training returned (``result``)."""
    run = store.get_run(run_id)
    if run is None:  # the row was just written by this process; only a deleted store loses it
        raise RuntimeError(f"run {run_id} vanished from the store")
    ended = {**(run.result or {}), **result}
    row = run_row(store, run)
    for key in TRAIN_RESULT_KEYS:
        row[key] = ended.get(key)
    row["final_val_nll"] = rounded(row["final_val_nll"], 4)
    if row["samples_per_s"] is None and run.samples and run.train_seconds:
        row["samples_per_s"] = round(run.samples / max(run.train_seconds, 1e-9), 1)  # in-process runs
    return row


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None: strict JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_line(value: Any) -> str:
    """``value`` as one line of strict JSON (paths and the like as strings, NaN as null)."""
    return json.dumps(_finite(value), default=str, allow_nan=False)
