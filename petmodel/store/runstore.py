"""The run store: one SQLite file that records runs, studies and their metrics; checkpoints beside it.

:class:`RunStore` is the one object the CLI, the app and the run monitors share. It is put
together from focused parts, each on the connection discipline of
:class:`petmodel.store.connection.StoreConnection` (WAL, ``BEGIN IMMEDIATE``, one short-lived
connection per operation, so a store can be shared by threads and pickled): the studies
(:class:`petmodel.store.studies.StudyRows`), the metrics (:class:`petmodel.store.metrics.MetricRows`),
deletion (:class:`petmodel.store.deletion.RunDeletion`), which model a user means
(:mod:`petmodel.store.lookup`) and, here, the runs themselves, orphan reaping (dead local drivers, and
drivers on other hosts that stopped reporting) and where a run's files live.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from petmodel.errors import PetmodelError, UsageError
from petmodel.run_names import run_name, taken_names
from petmodel.status import RunStatus
from petmodel.store.connection import check_status, new_id
from petmodel.store.deletion import RunDeletion
from petmodel.store.lookup import ModelChoice, find_model, find_run, usable_models
from petmodel.store.metrics import MetricRows
from petmodel.store.owners import is_orphan, stale_for, stale_run_seconds, stale_sentence
from petmodel.store.records import RunRecord, dumps
from petmodel.store.schema import ACTIVE_STATUSES, RUN_COLUMNS, RUN_JSON
from petmodel.store.studies import StudyRows


class RunStore(StudyRows, MetricRows, RunDeletion):
    """Runs, studies and metrics in ``root/runs.sqlite``; checkpoints in ``root/checkpoints/``.

    Holds only paths, so one instance may be shared across threads or pickled to another
    process on the same machine; every method opens and closes its own connection.
    """

    def create_run(
        self,
        config: dict[str, Any],
        *,
        name: str | None = None,
        kind: str = "train",
        study_id: str | None = None,
        status: str = RunStatus.QUEUED,
        owner: str | None = None,
        note: str | None = None,
    ) -> str:
        """Insert a run and return its new id; retries on the (rare) id collision.

        The run is named ``name``, else from its settings, made unique among the store's names
        (:func:`petmodel.run_names.run_name`) in the same write transaction, so two runs recorded
        at once never get the same one. A blank ``note`` is no note.
        """
        check_status(status)
        config = dict(config)
        config_json = dumps(config)
        note = (note or "").strip() or None
        for _ in range(20):
            run_id = new_id()
            try:
                with self._write() as conn:
                    taken = taken_names(row[0] for row in conn.execute("SELECT name FROM runs"))
                    conn.execute(
                        "INSERT INTO runs (id, created, name, kind, study_id, config, status, "
                        "workers, hosts, owner, note) VALUES (?, ?, ?, ?, ?, ?, ?, '[]', '[]', ?, ?)",
                        (run_id, time.time(), run_name(config, name, taken), kind, study_id, config_json, status,
                         owner, note),
                    )
                return run_id
            except sqlite3.IntegrityError:
                continue
        raise RuntimeError("Could not find a free run id after 20 tries.")  # pragma: no cover

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set the given columns; unknown columns are a bug (ValueError), a missing run is not.

        A ``model_path`` inside the store is kept relative to it, so a moved store still finds its models.
        """
        if fields.get("model_path"):
            fields["model_path"] = self._relative(fields["model_path"])
        values = self._encode(fields, RUN_COLUMNS, RUN_JSON)
        with self._write() as conn:
            if values:
                assignments = ", ".join(f"{column} = ?" for column in values)
                cursor = conn.execute(
                    f"UPDATE runs SET {assignments} WHERE id = ?", (*values.values(), run_id)
                )
                found = cursor.rowcount > 0
            else:
                found = conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is not None
        if not found:
            raise PetmodelError(f"No run called {run_id!r} in the store {self._root}.")

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return self._run(row) if row else None

    def list_runs(
        self,
        *,
        study_id: str | None = None,
        status: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs matching every filter given, newest first."""
        where, params = [], []
        for column, value in (("study_id", study_id), ("status", status), ("kind", kind)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created DESC, rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        with self._connect() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [self._run(row) for row in rows]

    def reconcile_orphans(self) -> list[str]:
        """Mark queued/running runs and studies whose driving process is gone as failed.

        On this host the OS says whether the owner lives (:func:`.owners.is_orphan`). On another host
        (a container restarted under a new name, say) it cannot, so a run whose last heartbeat (its
        newest metric row, else its start) is older than ``$PETMODEL_STALE_RUN_S`` is given up on
        (:func:`.owners.stale_for`), and a study with no run going and no sign of life within that bound
        too. Live local work is never touched, nor is a read-only store. Returns the ids marked.
        A malformed ``$PETMODEL_STALE_RUN_S`` is one UsageError, raised after the local orphans are marked.
        """
        reaped: list[str] = []
        if self._readonly:
            return reaped
        try:
            bound: float | None = stale_run_seconds()
            problem: UsageError | None = None
        except UsageError as err:
            bound, problem = None, err
        now = time.time()
        with self._write() as conn:
            reaped += self._reap_runs(conn, now, bound)
            reaped += self._reap_studies(conn, now, bound)
        if problem is not None:
            raise problem
        return reaped

    def _reap_runs(self, conn: sqlite3.Connection, now: float, bound: float | None) -> list[str]:
        """Fail the active runs whose driver is gone (see :meth:`reconcile_orphans`); their ids."""
        marks = ", ".join("?" * len(ACTIVE_STATUSES))
        # The newest row by id is the newest heartbeat; rows copied from a resumed run are older than its start.
        rows = conn.execute("SELECT id, owner, MAX(created, COALESCE(started, 0), COALESCE((SELECT recorded FROM "
                            "metrics WHERE run_id = runs.id ORDER BY id DESC LIMIT 1), 0)) AS heartbeat FROM runs "
                            f"WHERE status IN ({marks})", ACTIVE_STATUSES).fetchall()
        reaped = []
        for row in rows:
            pid = is_orphan(row["owner"])
            silent = None if pid is not None or bound is None else stale_for(row["owner"], row["heartbeat"], now, bound)
            if pid is not None:
                error, finished = f"The process driving this run stopped before it finished (pid {pid}).", now
            elif silent is not None:  # it stopped about when it last reported
                error = stale_sentence("run", row["id"], row["owner"], silent,
                                       resumable=self.state_path(row["id"]).is_file())
                finished = row["heartbeat"]
            else:
                continue
            conn.execute("UPDATE runs SET status = ?, finished = ?, error = ? WHERE id = ?",
                         (RunStatus.FAILED, finished, error, row["id"]))
            reaped.append(row["id"])
        return reaped

    @staticmethod
    def _reap_studies(conn: sqlite3.Connection, now: float, bound: float | None) -> list[str]:
        """Fail the active studies whose driver is gone; call after :meth:`_reap_runs`, whose marks it reads."""
        marks = ", ".join("?" * len(ACTIVE_STATUSES))
        # A study's sign of life: its own creation, and each run's start, end or creation (a run failed
        # for silence ends at its last heartbeat, so giving up on it does not look like news).
        rows = conn.execute(
            "SELECT s.id, json_extract(s.config, '$.owner') AS owner, "
            f"(SELECT COUNT(*) FROM runs r WHERE r.study_id = s.id AND r.status IN ({marks})) AS going, "
            "MAX(s.created, COALESCE((SELECT MAX(MAX(r.created, COALESCE(r.started, 0), COALESCE(r.finished, 0))) "
            "FROM runs r WHERE r.study_id = s.id), 0)) AS heartbeat "
            f"FROM studies s WHERE s.status IN ({marks})", (*ACTIVE_STATUSES, *ACTIVE_STATUSES)).fetchall()
        reaped = []
        for row in rows:
            pid = is_orphan(row["owner"])
            silent = None if pid is not None or bound is None or row["going"] else \
                stale_for(row["owner"], row["heartbeat"], now, bound)
            if pid is not None:
                error = f"The process driving this study stopped before it finished (pid {pid})."
            elif silent is not None:
                error = stale_sentence("study", row["id"], row["owner"], silent, resumable=False)
            else:
                continue
            conn.execute("UPDATE studies SET status = ?, error = ? WHERE id = ?", (RunStatus.FAILED, error, row["id"]))
            reaped.append(row["id"])
        return reaped

    def checkpoint_path(self, run_id: str) -> Path:
        """Where a run's checkpoint belongs; the file need not exist."""
        return self._checkpoint_dir / f"{run_id}.pt"

    def state_path(self, run_id: str) -> Path:
        """Where a run's latest training snapshot belongs (what ``--resume`` continues from)."""
        return self._checkpoint_dir / f"{run_id}.state.pt"

    def _relative(self, model_path: str | os.PathLike[str]) -> str:
        path = Path(model_path).expanduser()
        try:
            return path.resolve().relative_to(self._root.resolve()).as_posix()
        except ValueError:  # a checkpoint the user keeps elsewhere: keep its own path
            return str(path)

    def _run(self, row: sqlite3.Row) -> RunRecord:
        """A run record whose ``model_path`` is absolute, wherever the store folder is now."""
        record = RunRecord._from_row(row)
        if record.model_path:
            record.model_path = str(self._model_file(record.model_path))
        return record

    def _model_file(self, model_path: str) -> Path:
        # Relative model paths are relative to the store, so a moved store still resolves; stores
        # written before kept absolute paths, which still resolve to this store's checkpoints/.
        path = Path(model_path).expanduser()
        if not path.is_absolute():
            return self._root / path
        moved = self._checkpoint_dir / path.name
        return moved if not path.exists() and path.parent.name == "checkpoints" and moved.is_file() else path

    def models(self) -> list[RunRecord]:
        """Completed runs whose model file exists, best validation NLL first: the app's list, the CLI's ``best``."""
        return usable_models(self)

    def find_run(self, ref: str) -> RunRecord:
        """The run ``ref`` names (id, its start, name, best, latest): see :func:`petmodel.store.lookup.find_run`."""
        return find_run(self, ref)

    def find_model(self, ref: str | None = None) -> ModelChoice:
        """The model ``ref`` names, and which run it is: see :func:`petmodel.store.lookup.find_model`."""
        return find_model(self, ref)

    def resolve_model(self, ref: str | None = None) -> Path:
        """The existing checkpoint file ``ref`` names: ``best`` (None), ``latest``, a run id, a unique start of
        one, a run's name, or a checkpoint path; one-sentence PetmodelError when none or several match."""
        return find_model(self, ref).path
