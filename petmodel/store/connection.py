"""The run store's folder, its SQLite file and the one way every part of the store talks to it.

Several processes use one store at the same time: the Streamlit app, the CLI, and the
background threads that receive metrics from Dask workers. That shapes the design:

* WAL mode, so readers never wait for writers and writers wait only for each other;
* ``busy_timeout`` plus ``BEGIN IMMEDIATE`` for every write, so a writer queues for the
  lock up front instead of failing with "database is locked" when it upgrades a read;
* a short-lived connection per operation, so a store holds no sqlite3 object
  and can be shared by threads, survive ``fork`` and be pickled.

:class:`StoreConnection` is that discipline; the runs (:mod:`petmodel.store.runstore`), the
studies (:mod:`petmodel.store.studies`) and the metrics (:mod:`petmodel.store.metrics`) build on it,
and :class:`petmodel.store.RunStore` is all three.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from petmodel.errors import PetmodelError, StoreBusy, sqlite_code
from petmodel.store.folders import nearly_full, read_only_folder
from petmodel.store.migrate import create_or_upgrade
from petmodel.store.records import dumps, plain
from petmodel.store.schema import BUSY_TIMEOUT_MS, STATUSES


def new_id() -> str:
    """``YYYYMMDD-HHMMSS-xxxx`` in local time: sorts by creation and reads like a timestamp."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def check_status(status: Any) -> None:
    """A status outside :class:`petmodel.status.RunStatus` is a bug: refuse it before it is written."""
    if status not in STATUSES:
        raise ValueError(f"Unknown status {status!r}; expected one of {', '.join(STATUSES)}.")


class StoreConnection:
    """The store folder (``root/runs.sqlite``, ``root/checkpoints/``) and short-lived connections to it.

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
        return f"{type(self).__name__}({str(self._root)!r})"

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
        except sqlite3.DatabaseError as err:
            said = self._sentence(err)
            if said is err:
                raise
            raise said from None
        finally:
            if conn is not None:
                conn.close()

    def _sentence(self, err: sqlite3.DatabaseError) -> BaseException:
        """The one sentence for an SQLite error a user can act on, decided by its result code (never its text);
        ``err`` itself for anything else (a bug worth its traceback)."""
        code = sqlite_code(err)
        if code == sqlite3.SQLITE_FULL or code == sqlite3.SQLITE_IOERR and nearly_full(self._root):
            return StoreBusy(f"The disk is full: the run store {self._db_path.name} in {self._root} could "
                             "not record the change; free some space.")
        if code == sqlite3.SQLITE_READONLY:
            return PetmodelError(f"The run store {self._root} is read-only: it can be read but not changed; "
                                 "use a store folder you can write to (PETMODEL_STORE or --store).")
        if code == sqlite3.SQLITE_IOERR:
            return StoreBusy(f"The run store {self._db_path.name} in {self._root} could not be written "
                             "(a disk I/O error); check the disk.")
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return StoreBusy(f"The run store {self._db_path} stayed locked by another process for over "
                             f"{BUSY_TIMEOUT_MS / 1000:g} s; try again.")
        if code == sqlite3.SQLITE_CANTOPEN:
            return PetmodelError(f"Cannot open the run store database {self._db_path}; check that it is a "
                                 "file you can write to.")
        if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            return PetmodelError(f"{self._db_path} is not a usable SQLite database ({err}); move it aside or "
                                 "use another store folder.")
        return err

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
            check_status(fields["status"])
        encoded: dict[str, Any] = {}
        for name, value in fields.items():
            if name in json_columns and value is not None:
                if json_columns[name] is list and not isinstance(value, (str, Mapping)):
                    value = list(value)  # tuples, sets of worker addresses
                encoded[name] = dumps(value)
            else:
                encoded[name] = plain(value)
        return encoded
