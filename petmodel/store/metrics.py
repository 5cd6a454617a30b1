"""The run store's metrics: the rows ranks send while they train, read back incrementally or as a frame.

Rows are appended in batches (one transaction per batch, so the monitor thread that drains a run's
events never holds the lock long) and read by id, so a page polls only the rows it has not seen.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from petmodel.errors import PetmodelError
from petmodel.store.connection import StoreConnection
from petmodel.store.records import plain
from petmodel.store.schema import METRIC_COLUMNS, METRIC_FLOATS, METRIC_INPUT, METRIC_INTS, STEP_TIME_COLUMNS

if TYPE_CHECKING:  # pandas is heavy; import it only where a frame is built
    import pandas as pd


class MetricRows(StoreConnection):
    """Append, copy, trim and read metric rows (part of :class:`petmodel.store.RunStore`)."""

    def add_metrics(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append a batch of metric rows in one transaction.

        Missing keys are stored as NULL, except ``kind`` which defaults to ``"train"`` so the
        row shows up in ``metrics(kind="train")``, and ``recorded``, which is now: when the store
        heard from the rank (its heartbeat). Unknown keys are a bug (ValueError).
        """
        params = []
        now = time.time()
        kind, recorded = METRIC_INPUT.index("kind"), METRIC_INPUT.index("recorded")
        for row in rows:
            unknown = set(row) - set(METRIC_INPUT)
            if unknown:
                raise ValueError(
                    f"Unknown metric field(s) {', '.join(sorted(unknown))}; "
                    f"expected some of {', '.join(METRIC_INPUT)}."
                )
            values = [plain(row.get(column)) for column in METRIC_INPUT]
            if values[kind] is None:
                values[kind] = "train"
            if values[recorded] is None:
                values[recorded] = now
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

    def step_time_rows(self, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The step-time windows (rows with ``step_s``, see :mod:`petmodel.step_timing`) of each run, in order.

        One query for many runs (``runs --json`` lists fifty); runs without windows are absent.
        """
        ids = list(dict.fromkeys(run_ids))
        columns = ", ".join(("run_id", "rank", "step", *STEP_TIME_COLUMNS))
        out: dict[str, list[dict[str, Any]]] = {}
        with self._connect() as conn:
            for start in range(0, len(ids), 500):  # stay far below SQLite's variable limit
                chunk = ids[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                for row in conn.execute(f"SELECT {columns} FROM metrics WHERE run_id IN ({marks}) "
                                        "AND step_s IS NOT NULL ORDER BY id", chunk):
                    out.setdefault(row["run_id"], []).append(dict(row))
        return out
