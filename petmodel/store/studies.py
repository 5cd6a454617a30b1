"""The run store's studies: one row per sweep or search, its config, live progress and result.

A study's runs are ordinary runs with ``study_id`` set (:mod:`petmodel.store.runstore`); the row
here is what the Experiments page and the CLI poll while it runs.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from petmodel.errors import PetmodelError
from petmodel.status import RunStatus
from petmodel.store.connection import StoreConnection, check_status, new_id
from petmodel.store.records import StudyRecord, dumps
from petmodel.store.schema import STUDY_COLUMNS, STUDY_JSON


class StudyRows(StoreConnection):
    """Create, update, read and list studies (part of :class:`petmodel.store.RunStore`)."""

    def create_study(
        self,
        config: dict[str, Any],
        *,
        kind: str,
        name: str | None = None,
        status: str = RunStatus.RUNNING,
    ) -> str:
        """Insert a study (sweep or search) and return its id; same id format as runs."""
        check_status(status)
        config_json = dumps(dict(config))
        for _ in range(20):
            study_id = new_id()
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
