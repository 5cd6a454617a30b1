"""The store's SQLite schema, its columns and the run statuses: the one place that knows the tables."""

from __future__ import annotations

from petmodel.status import ACTIVE, FINISHED, RunStatus

SCHEMA_VERSION = 2  # 2: restarts, lost_workers, resumed_from
BUSY_TIMEOUT_MS = 10_000

STATUSES = tuple(RunStatus)
FINISHED_STATUSES = FINISHED
ACTIVE_STATUSES = ACTIVE

RUN_COLUMNS = (
    "id", "created", "name", "kind", "study_id", "config", "status", "workers", "hosts",
    "backend", "started", "finished", "train_seconds", "samples", "val_nll", "best_val_nll",
    "error", "failed_worker", "model_path", "result", "owner", "restarts", "lost_workers", "resumed_from",
)  # fmt: skip
STUDY_COLUMNS = ("id", "created", "name", "kind", "config", "status", "result", "error")
METRIC_COLUMNS = (
    "id", "run_id", "rank", "step", "epoch", "elapsed", "samples", "loss", "samples_per_s",
    "val_nll", "kind",
)  # fmt: skip
# Columns a caller may supply in add_metrics; id and run_id come from the store.
METRIC_INPUT = METRIC_COLUMNS[2:]
METRIC_FLOATS = ("epoch", "elapsed", "loss", "samples_per_s", "val_nll")  # epochs are fractional
METRIC_INTS = ("id", "rank", "step", "samples")

RUN_JSON = {"config": dict, "workers": list, "hosts": list, "result": dict, "lost_workers": list}
# Columns added after version 1, with their SQL type: older stores gain them when opened.
ADDED_RUN_COLUMNS = {"restarts": "INTEGER NOT NULL DEFAULT 0", "lost_workers": "TEXT", "resumed_from": "TEXT"}
STUDY_JSON = {"config": dict, "result": dict}

# Stores written before the heartbeat column was dropped still have it; nothing reads it.
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    name TEXT,
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
    resumed_from TEXT  -- the run this one continues (train --resume)
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
    loss REAL,
    samples_per_s REAL,
    val_nll REAL,
    kind TEXT
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
