"""What the store hands back: plain snapshots of rows (runs, studies) and metric rows in its columns."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from petmodel.store.schema import FINISHED_STATUSES, METRIC_INPUT


def metric_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """The store's columns of a training loop's metric row.

    ``samples`` is stored as the samples seen by *all* ranks up to that step: ranks get
    work-balanced (unequal) slices of each global batch, so a rank's own count times the
    number of workers would not be the global count. The rank's own count goes to ``rank_samples``.
    """
    record = {k: row.get(k) for k in METRIC_INPUT}
    if row.get("global_samples") is not None:
        record["samples"] = row["global_samples"]
        record["rank_samples"] = row.get("samples")
    return record


def _json_default(obj: Any) -> Any:
    # numpy/torch scalars and arrays, and paths, turn up in configs and results.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=_json_default)


def plain(value: Any) -> Any:
    """A value sqlite3 can bind: numpy/torch scalars arrive from workers and sqlite rejects them."""
    if value is None or isinstance(value, (str, int, float, bytes)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "item"):
        return value.item()
    return value


@dataclass
class RunRecord:
    """One row of ``runs`` with JSON columns decoded; a snapshot, not a live view."""

    id: str
    created: float
    name: str | None
    kind: str
    study_id: str | None
    config: dict[str, Any]
    status: str
    workers: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    backend: str | None = None
    started: float | None = None
    finished: float | None = None
    train_seconds: float | None = None
    samples: int | None = None
    val_nll: float | None = None
    best_val_nll: float | None = None
    error: str | None = None
    failed_worker: str | None = None
    model_path: str | None = None
    result: dict[str, Any] | None = None
    owner: str | None = None
    restarts: int = 0
    lost_workers: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: str | None = None
    note: str | None = None

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def duration(self) -> float | None:
        """Seconds since start, up to ``finished`` (or now while it still runs); None if never started."""
        if self.started is None:
            return None
        end = self.finished if self.finished is not None else time.time()
        return end - self.started

    @property
    def nll(self) -> float | None:
        """The run's headline validation NLL: its best, or its last when no best was recorded."""
        return self.best_val_nll if self.best_val_nll is not None else self.val_nll

    @classmethod
    def _from_row(cls, row: sqlite3.Row) -> RunRecord:
        values = dict(row)
        values["config"] = json.loads(values["config"]) if values["config"] else {}
        values["workers"] = json.loads(values["workers"]) if values["workers"] else []
        values["hosts"] = json.loads(values["hosts"]) if values["hosts"] else []
        values["result"] = json.loads(values["result"]) if values["result"] else None
        values["lost_workers"] = json.loads(values.get("lost_workers") or "[]")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


@dataclass
class StudyRecord:
    """One row of ``studies`` (a sweep or a hyperparameter search) with JSON columns decoded."""

    id: str
    created: float
    name: str | None
    kind: str
    config: dict[str, Any]
    status: str
    result: dict[str, Any] | None = None
    error: str | None = None

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @classmethod
    def _from_row(cls, row: sqlite3.Row) -> StudyRecord:
        values = dict(row)
        values["config"] = json.loads(values["config"]) if values["config"] else {}
        values["result"] = json.loads(values["result"]) if values["result"] else None
        return cls(**values)
