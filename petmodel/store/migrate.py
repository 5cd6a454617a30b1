"""Create a store's tables, or bring an older store's up to date, when a process opens it."""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Any

from petmodel.errors import PetmodelError, sqlite_code
from petmodel.run_names import run_name, taken_names
from petmodel.store.schema import ADDED_METRIC_COLUMNS, ADDED_RUN_COLUMNS, BUSY_TIMEOUT_MS, SCHEMA, SCHEMA_VERSION


def switch_to_wal(conn: sqlite3.Connection) -> str:
    """Put the file in WAL mode (persistent; cannot run inside a transaction); the mode it ends in.

    On a brand-new file that several processes open at once, the switch needs an exclusive
    lock and SQLite skips its busy handler there (to avoid a deadlock) and fails at once with
    "database is locked": so retry, for as long as busy_timeout would have waited.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as err:
            if sqlite_code(err) not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or time.monotonic() > deadline:
                raise
            time.sleep(0.005 + 0.02 * secrets.randbelow(100) / 100)


def create_or_upgrade(conn: sqlite3.Connection, db_path: Path) -> None:
    """WAL mode, then the tables (and columns newer petmodels added) in one write transaction."""
    mode = switch_to_wal(conn)
    if mode.lower() != "wal":
        raise PetmodelError(f"The run store {db_path} cannot use WAL mode (got {mode!r}); put the store on a "
                            "local disk.")
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise PetmodelError(f"The run store {db_path} was written by a newer petmodel (schema {version}, this "
                                f"one knows {SCHEMA_VERSION}); upgrade petmodel.")
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        for table, added in (("runs", ADDED_RUN_COLUMNS), ("metrics", ADDED_METRIC_COLUMNS)):
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            for column, sql_type in added.items():
                if column not in have:  # a store from an older petmodel
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")
        if version < 4:  # runs recorded before every run had a name
            name_unnamed_runs(conn)
        if version < SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def name_unnamed_runs(conn: sqlite3.Connection) -> int:
    """Give each run without a name the one its settings make (oldest first, so the first keeps the plain
    name and later ones get ``-2``, …); how many were named. Done once, so every reader (the ``runs``
    table, ``--model NAME``, the app's pickers) sees the same unique names, never ones made up on the fly.
    """
    taken = taken_names(row[0] for row in conn.execute("SELECT name FROM runs WHERE name IS NOT NULL"))
    unnamed = conn.execute("SELECT id, config FROM runs WHERE name IS NULL OR trim(name) = '' "
                           "ORDER BY created, rowid").fetchall()
    for run_id, config in unnamed:
        name = run_name(_config(config), None, taken)
        conn.execute("UPDATE runs SET name = ? WHERE id = ?", (name, run_id))
        taken |= taken_names([name])
    return len(unnamed)


def _config(text: Any) -> dict[str, Any]:
    """A run's stored config; ``{}`` for one that does not parse (the name then says less, the upgrade goes on)."""
    try:
        config = json.loads(text) if text else {}
    except (TypeError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}
