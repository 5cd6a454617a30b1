"""The run store: one SQLite file that records runs, studies and their metrics.

Several processes use one store at the same time: the Streamlit app, the CLI, and the
background threads that receive metrics from Dask workers. That shapes the design:

* WAL mode, so readers never wait for writers and writers wait only for each other;
* ``busy_timeout`` plus ``BEGIN IMMEDIATE`` for every write, so a writer queues for the
  lock up front instead of failing with "database is locked" when it upgrades a read;
* a short-lived connection per operation, so a :class:`RunStore` holds no sqlite3 object
  and can be shared by threads, survive ``fork`` and be pickled.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from petmodel.errors import PetmodelError, is_disk_full
from petmodel.store.folders import nearly_full, read_only_folder
from petmodel.store.migrate import create_or_upgrade
from petmodel.store.owners import is_orphan
from petmodel.store.records import RunRecord, StudyRecord, dumps, plain
from petmodel.store.schema import (
    ACTIVE_STATUSES,
    BUSY_TIMEOUT_MS,
    METRIC_COLUMNS,
    METRIC_FLOATS,
    METRIC_INPUT,
    METRIC_INTS,
    RUN_COLUMNS,
    RUN_JSON,
    STATUSES,
    STUDY_COLUMNS,
    STUDY_JSON,
)

if TYPE_CHECKING:  # pandas is heavy; import it only where a frame is built
    import pandas as pd


def _new_id() -> str:
    """``YYYYMMDD-HHMMSS-xxxx`` in local time: sorts by creation and reads like a timestamp."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def _check_status(status: Any) -> None:
    if status not in STATUSES:
        raise ValueError(f"Unknown status {status!r}; expected one of {', '.join(STATUSES)}.")


class RunStore:
    """Runs, studies and metrics in ``root/runs.sqlite``; checkpoints in ``root/checkpoints/``.

    Holds only paths, so one instance may be shared across threads or pickled to another
    process on the same machine; every method opens and closes its own connection.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root).expanduser()
        self._db_path = self._root / "runs.sqlite"
        self._checkpoint_dir = self._root / "checkpoints"
        self._readonly = self._db_path.is_file() and read_only_folder(self._root)
        if self._readonly:
            return  # readable as it is: listing runs and generating need no writes
        try:
            self._checkpoint_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise PetmodelError(
                f"Cannot create the run store folder {self._root} ({err.strerror or err}); "
                "pick a folder you can write to, e.g. with PETMODEL_STORE."
            ) from err
        self._init_schema()

    @property
    def readonly(self) -> bool:
        """Whether this store is on a read-only folder: it reads, and every write says so in one sentence."""
        return self._readonly

    @property
    def root(self) -> Path:
        return self._root

    @property
    def db_path(self) -> Path:
        return self._db_path

    @property
    def checkpoint_dir(self) -> Path:
        return self._checkpoint_dir

    def __repr__(self) -> str:
        return f"RunStore({str(self._root)!r})"

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A fresh autocommit connection; sqlite errors a user can act on become PetmodelError."""
        conn: sqlite3.Connection | None = None
        try:
            # isolation_level=None: we issue BEGIN ourselves, so Python never opens a
            # deferred transaction behind our back.
            if self._readonly:
                # immutable: a WAL database cannot create its -shm file in a read-only folder.
                conn = sqlite3.connect(f"{self._db_path.resolve().as_uri()}?mode=ro&immutable=1", uri=True,
                                       isolation_level=None)
            else:
                conn = sqlite3.connect(self._db_path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            yield conn
        except sqlite3.OperationalError as err:
            message = str(err)
            if is_disk_full(err) or "disk I/O error" in message and nearly_full(self._root):
                raise PetmodelError(f"The disk is full: the run store {self._db_path.name} in {self._root} could "
                                    "not record the change; free some space.") from None
            if "readonly" in message:
                raise PetmodelError(f"The run store {self._root} is read-only: it can be read but not changed; "
                                    "use a store folder you can write to (PETMODEL_STORE or --store).") from None
            if "disk I/O error" in message:
                raise PetmodelError(f"The run store {self._db_path.name} in {self._root} could not be written "
                                    "(a disk I/O error); check the disk.") from None
            if "locked" in message or "busy" in message:
                raise PetmodelError(
                    f"The run store {self._db_path} stayed locked by another process for over "
                    f"{BUSY_TIMEOUT_MS // 1000} s; try again."
                ) from err
            if "unable to open" in message:
                raise PetmodelError(
                    f"Cannot open the run store database {self._db_path}; check that it is a "
                    "file you can write to."
                ) from err
            raise
        except sqlite3.DatabaseError as err:
            # Exactly DatabaseError: "file is not a database", "disk image is malformed".
            if type(err) is sqlite3.DatabaseError:
                raise PetmodelError(
                    f"{self._db_path} is not a usable SQLite database ({err}); move it aside or "
                    "use another store folder."
                ) from err
            raise
        finally:
            if conn is not None:
                conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front (waiting up to busy_timeout)."""
        if self._readonly:
            raise PetmodelError(f"The run store {self._root} is read-only: it can be read but not changed; "
                                "use a store folder you can write to (PETMODEL_STORE or --store).")
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _init_schema(self) -> None:
        with self._connect() as conn:
            create_or_upgrade(conn, self._db_path)

    def create_run(
        self,
        config: dict[str, Any],
        *,
        name: str | None = None,
        kind: str = "train",
        study_id: str | None = None,
        status: str = "queued",
        owner: str | None = None,
    ) -> str:
        """Insert a run and return its new id; retries on the (rare) id collision."""
        _check_status(status)
        config_json = dumps(dict(config))
        for _ in range(20):
            run_id = _new_id()
            try:
                with self._write() as conn:
                    conn.execute(
                        "INSERT INTO runs (id, created, name, kind, study_id, config, status, "
                        "workers, hosts, owner) VALUES (?, ?, ?, ?, ?, ?, ?, '[]', '[]', ?)",
                        (run_id, time.time(), name, kind, study_id, config_json, status, owner),
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
        """Mark queued/running runs and studies whose driving process died on this host as failed.

        Work owned by live processes or by other hosts is left alone (see :mod:`.owners`), and a
        read-only store is left as it is. Returns the ids of the runs and studies marked.
        """
        reaped: list[str] = []
        if self._readonly:
            return reaped
        with self._write() as conn:
            marks = ", ".join("?" * len(ACTIVE_STATUSES))
            for table, what in (("runs", "run"), ("studies", "study")):
                owner_sql = "owner" if table == "runs" else "json_extract(config, '$.owner')"
                rows = conn.execute(f"SELECT id, {owner_sql} AS owner FROM {table} "
                                    f"WHERE status IN ({marks})", ACTIVE_STATUSES).fetchall()
                for row in rows:
                    pid = is_orphan(row["owner"])
                    if pid is None:
                        continue
                    error = f"The process driving this {what} stopped before it finished (pid {pid})."
                    if table == "runs":
                        conn.execute("UPDATE runs SET status = 'failed', finished = ?, error = ? WHERE id = ?",
                                     (time.time(), error, row["id"]))
                    else:
                        conn.execute("UPDATE studies SET status = 'failed', error = ? WHERE id = ?",
                                     (error, row["id"]))
                    reaped.append(row["id"])
        return reaped

    def checkpoint_path(self, run_id: str) -> Path:
        """Where a run's checkpoint belongs; the file need not exist."""
        return self._checkpoint_dir / f"{run_id}.pt"

    def state_path(self, run_id: str) -> Path:
        """Where a run's latest training snapshot belongs (what ``--resume`` continues from)."""
        return self._checkpoint_dir / f"{run_id}.state.pt"

    def copy_metrics(self, from_run: str, to_run: str, *, up_to_step: int) -> int:
        """Copy ``from_run``'s metric rows up to ``up_to_step`` to ``to_run`` (a resumed run's history)."""
        columns = ", ".join(METRIC_INPUT)
        with self._write() as conn:
            return conn.execute(f"INSERT INTO metrics (run_id, {columns}) SELECT ?, {columns} FROM metrics "
                                "WHERE run_id = ? AND step <= ? ORDER BY id", (to_run, from_run, int(up_to_step))).rowcount

    def trim_metrics(self, run_id: str, after_step: int) -> int:
        """Drop a run's metric rows past ``after_step``: a run that re-forms from its snapshot trains
        those steps again, and its curves should read as one. Returns the rows dropped."""
        with self._write() as conn:
            return conn.execute("DELETE FROM metrics WHERE run_id = ? AND step > ?", (run_id, int(after_step))).rowcount

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

    def resolve_model(self, ref: str) -> Path:
        """Turn a run id or a checkpoint path into an existing checkpoint file."""
        run = self.get_run(ref)
        if run is not None:
            if not run.model_path:
                raise PetmodelError(
                    f"Run {ref!r} has no saved model (its status is {run.status}); "
                    "pick a completed run."
                )
            path = self._model_file(run.model_path)
            if not path.is_file():
                raise PetmodelError(
                    f"The checkpoint of run {ref!r} ({path}) was deleted; retrain or pick another run."
                )
            return path
        path = Path(ref).expanduser()
        if path.is_file():
            return path
        raise PetmodelError(
            f"No run or checkpoint file called {ref!r}; list runs with `python -m petmodel runs`."
        )

    def add_metrics(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append a batch of metric rows in one transaction.

        Missing keys are stored as NULL, except ``kind`` which defaults to ``"train"`` so the
        row shows up in ``metrics(kind="train")``. Unknown keys are a bug (ValueError).
        """
        params = []
        for row in rows:
            unknown = set(row) - set(METRIC_INPUT)
            if unknown:
                raise ValueError(
                    f"Unknown metric field(s) {', '.join(sorted(unknown))}; "
                    f"expected some of {', '.join(METRIC_INPUT)}."
                )
            values = [plain(row.get(column)) for column in METRIC_INPUT]
            if values[-1] is None:
                values[-1] = "train"
            params.append((run_id, *values))
        if not params:
            return
        columns = ", ".join(("run_id", *METRIC_INPUT))
        marks = ", ".join("?" * (len(METRIC_INPUT) + 1))
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise PetmodelError(f"No run called {run_id!r} in the store {self._root}.")
            conn.executemany(f"INSERT INTO metrics ({columns}) VALUES ({marks})", params)

    def metrics(self, run_id: str, *, since_id: int = 0, kind: str | None = None) -> list[dict[str, Any]]:
        """Metric rows with ``id > since_id`` in insertion order; poll with the last id seen."""
        sql = "SELECT * FROM metrics WHERE run_id = ? AND id > ?"
        params: list[Any] = [run_id, since_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        sql += " ORDER BY id"
        with self._connect() as conn:
            return [dict(row) for row in conn.execute(sql, params)]

    def metrics_frame(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """All metrics of the given runs as one frame (columns METRIC_COLUMNS), ordered by id."""
        import pandas as pd

        ids = list(dict.fromkeys(run_ids))
        rows: list[tuple[Any, ...]] = []
        with self._connect() as conn:
            for start in range(0, len(ids), 500):  # stay far below SQLite's variable limit
                chunk = ids[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                rows.extend(
                    tuple(row)
                    for row in conn.execute(
                        f"SELECT {', '.join(METRIC_COLUMNS)} FROM metrics "
                        f"WHERE run_id IN ({marks}) ORDER BY id",
                        chunk,
                    )
                )
        rows.sort(key=lambda row: row[0])
        frame = pd.DataFrame.from_records(rows, columns=list(METRIC_COLUMNS))
        # Fixed dtypes so callers can plot an all-NULL or empty column without surprises.
        for column in METRIC_FLOATS:
            frame[column] = frame[column].astype("float64")
        for column in METRIC_INTS:
            frame[column] = frame[column].astype("Int64")
        return frame

    def create_study(
        self,
        config: dict[str, Any],
        *,
        kind: str,
        name: str | None = None,
        status: str = "running",
    ) -> str:
        """Insert a study (sweep or search) and return its id; same id format as runs."""
        _check_status(status)
        config_json = dumps(dict(config))
        for _ in range(20):
            study_id = _new_id()
            try:
                with self._write() as conn:
                    conn.execute(
                        "INSERT INTO studies (id, created, name, kind, config, status) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (study_id, time.time(), name, kind, config_json, status),
                    )
                return study_id
            except sqlite3.IntegrityError:
                continue
        raise RuntimeError("Could not find a free study id after 20 tries.")  # pragma: no cover

    def update_study(self, study_id: str, **fields: Any) -> None:
        values = self._encode(fields, STUDY_COLUMNS, STUDY_JSON)
        with self._write() as conn:
            if values:
                assignments = ", ".join(f"{column} = ?" for column in values)
                cursor = conn.execute(
                    f"UPDATE studies SET {assignments} WHERE id = ?", (*values.values(), study_id)
                )
                found = cursor.rowcount > 0
            else:
                found = (
                    conn.execute("SELECT 1 FROM studies WHERE id = ?", (study_id,)).fetchone()
                    is not None
                )
        if not found:
            raise PetmodelError(f"No study called {study_id!r} in the store {self._root}.")

    def get_study(self, study_id: str) -> StudyRecord | None:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM studies WHERE id = ?", (study_id,)).fetchone()
        return StudyRecord._from_row(row) if row else None

    def list_studies(self, limit: int | None = None) -> list[StudyRecord]:
        """Studies, newest first."""
        sql = "SELECT * FROM studies ORDER BY created DESC, rowid DESC"
        params: list[Any] = []
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        with self._connect() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [StudyRecord._from_row(row) for row in rows]

    @staticmethod
    def _encode(
        fields: Mapping[str, Any], columns: Sequence[str], json_columns: Mapping[str, type]
    ) -> dict[str, Any]:
        """Validate column names and status, JSON-encode JSON columns, make values bindable."""
        unknown = [name for name in fields if name not in columns or name == "id"]
        if unknown:
            raise ValueError(
                f"Cannot set {', '.join(unknown)}; settable fields are "
                f"{', '.join(c for c in columns if c != 'id')}."
            )
        if "status" in fields:
            _check_status(fields["status"])
        encoded: dict[str, Any] = {}
        for name, value in fields.items():
            if name in json_columns and value is not None:
                if json_columns[name] is list and not isinstance(value, (str, Mapping)):
                    value = list(value)  # tuples, sets of worker addresses
                encoded[name] = dumps(value)
            else:
                encoded[name] = plain(value)
        return encoded
