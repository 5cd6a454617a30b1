"""The store's SQLite schema, its columns and the run statuses: the one place that knows the tables."""

from __future__ import annotations

from petmodel.status import ACTIVE, FINISHED, RunStatus

SCHEMA_VERSION = 4  # 2: restarts, lost_workers, resumed_from; 3: metrics.rank_samples, metrics.recorded, step times;
# 4: runs.note, and every run named (petmodel.run_names)
BUSY_TIMEOUT_MS = 10_000

STATUSES = tuple(RunStatus)
FINISHED_STATUSES = FINISHED
ACTIVE_STATUSES = ACTIVE

RUN_COLUMNS = (
    "id", "created", "name", "kind", "study_id", "config", "status", "workers", "hosts",
    "backend", "started", "finished", "train_seconds", "samples", "val_nll", "best_val_nll",
    "error", "failed_worker", "model_path", "result", "owner", "restarts", "lost_workers", "resumed_from", "note",
)  # fmt: skip
STUDY_COLUMNS = ("id", "created", "name", "kind", "config", "status", "result", "error")
# Where a rank's step time went over a window of steps (petmodel.step_timing), on one row per window,
# NULL on the others: seconds per step, this rank's names per step, the noise scale's squared norms.
STEP_TIME_COLUMNS = {"step_s": "REAL", "data_s": "REAL", "compute_s": "REAL", "allreduce_s": "REAL",
                     "idle_s": "REAL", "optimizer_s": "REAL", "report_s": "REAL", "agree_s": "REAL",
                     "rank_batch": "INTEGER", "grad_sq": "REAL", "grad_sq_global": "REAL"}
# ``samples``: all ranks' samples up to the step (the curves' x axis); ``rank_samples``: this rank's own
# (work-balanced slices differ); ``recorded``: wall-clock time the store wrote the row (a rank's heartbeat).
METRIC_COLUMNS = (
    "id", "run_id", "rank", "step", "epoch", "elapsed", "samples", "rank_samples", "recorded", "loss",
    "samples_per_s", "val_nll", "kind", *STEP_TIME_COLUMNS,
)  # fmt: skip
# Columns a caller may supply in add_metrics; id and run_id come from the store.
METRIC_INPUT = METRIC_COLUMNS[2:]
METRIC_FLOATS = ("epoch", "elapsed", "recorded", "loss", "samples_per_s", "val_nll",
                 *(c for c, t in STEP_TIME_COLUMNS.items() if t == "REAL"))  # epochs are fractional
METRIC_INTS = ("id", "rank", "step", "samples", "rank_samples", "rank_batch")

RUN_JSON = {"config": dict, "workers": list, "hosts": list, "result": dict, "lost_workers": list}
# Columns added after version 1, with their SQL type: older stores gain them when opened.
ADDED_RUN_COLUMNS = {"restarts": "INTEGER NOT NULL DEFAULT 0", "lost_workers": "TEXT", "resumed_from": "TEXT",
                     "note": "TEXT"}  # note: version 4
STUDY_JSON = {"config": dict, "result": dict}
ADDED_METRIC_COLUMNS = {"rank_samples": "INTEGER", "recorded": "REAL", **STEP_TIME_COLUMNS}  # version 3

# Stores written before the heartbeat column was dropped still have it; nothing reads it.
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    name TEXT,  -- given at launch, else made from its settings (petmodel.run_names), unique, case aside
    kind TEXT NOT NULL,
    study_id TEXT,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    workers TEXT,
    hosts TEXT,
    backend TEXT,
    started REAL,
    finished REAL,
    train_seconds REAL,
    samples INTEGER,
    val_nll REAL,
    best_val_nll REAL,
    error TEXT,
    failed_worker TEXT,
    model_path TEXT,
    result TEXT,
    owner TEXT,
    restarts INTEGER NOT NULL DEFAULT 0,  -- times the run re-formed after losing a worker
    lost_workers TEXT,  -- JSON, one per lost worker: worker, rank, step (re-formed from), failed_step, at, why
    resumed_from TEXT,  -- the run this one continues (train --resume)
    note TEXT  -- what the run is for, in the user's words (train --note, runs note)
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created);
CREATE INDEX IF NOT EXISTS runs_study ON runs (study_id);
CREATE TABLE IF NOT EXISTS metrics (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs (id),
    rank INTEGER,
    step INTEGER,
    epoch INTEGER,
    elapsed REAL,
    samples INTEGER,
    rank_samples INTEGER,
    recorded REAL,
    loss REAL,
    samples_per_s REAL,
    val_nll REAL,
    kind TEXT,
    step_s REAL,  -- a window of steps (petmodel.step_timing): its wall time per step
    data_s REAL,  -- and where that went, per step: batch preparation,
    compute_s REAL,  -- forward + backward,
    allreduce_s REAL,  -- the gradient all-reduce compute did not hide,
    idle_s REAL,  -- waiting for a slower rank,
    optimizer_s REAL,  -- clipping + Adam,
    report_s REAL,  -- handing the metric row over,
    agree_s REAL,  -- the stop agreement, per step
    rank_batch INTEGER,  -- this rank's names in the step
    grad_sq REAL,  -- squared norm of this rank's gradient before the all-reduce (DDP only)
    grad_sq_global REAL  -- squared norm of the averaged gradient
);
CREATE INDEX IF NOT EXISTS metrics_run ON metrics (run_id, id);
CREATE TABLE IF NOT EXISTS studies (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    name TEXT,
    kind TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    result TEXT,
    error TEXT
);
"""
