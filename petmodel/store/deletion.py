"""Deleting runs and studies from the store, with the files that belong to them.

Failed and test runs pile up; deleting one removes its row, its metric rows, its checkpoint and
its training snapshot. A run that is queued or running is not deleted (its driver would write
to a run that is gone) unless ``force`` says its driver is gone too: a run recorded running by a
host that no longer exists would otherwise stay for good. Even then a run driven by a live process
on this host is kept, since that one is known to be alive. A batch is all or nothing: the statuses
are checked inside the same write transaction that deletes the rows, so no run can start between
the check and the delete.
Files go after the commit: a crash between the two leaves an orphan file, never a row whose
checkpoint is missing. Only files inside the store's own ``checkpoints/`` are removed; a model a
user keeps elsewhere (an absolute ``model_path`` outside the store) stays where it is.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from petmodel.errors import PetmodelError
from petmodel.store.connection import StoreConnection
from petmodel.store.owners import describe_owner, live_here
from petmodel.store.schema import ACTIVE_STATUSES


class RunDeletion(StoreConnection):
    """Delete runs and studies (part of :class:`petmodel.store.RunStore`)."""

    def delete_runs(self, run_ids: Iterable[str], *, force: bool = False) -> list[str]:
        """Delete finished runs with their metrics, checkpoints and snapshots; the ids deleted.

        ``force`` deletes queued and running runs too, except one that a live process on this host
        drives. Raises :class:`PetmodelError` (one sentence, nothing deleted) when an id is unknown or
        a run is still queued or running (with ``force``: driven by a live local process).
        """
        ids = list(dict.fromkeys(str(i) for i in run_ids))
        if not ids:
            return []
        with self._write() as conn:
            rows = self._runs_by_id(conn, ids)
            unknown = [i for i in ids if i not in rows]
            if unknown:
                raise PetmodelError(f"No run{'s' if len(unknown) > 1 else ''} called {_listed(unknown)} in the "
                                    "store; list runs with `python -m petmodel runs`.")
            active = [i for i in ids if rows[i]["status"] in ACTIVE_STATUSES]
            driven = {i: pid for i in active if (pid := live_here(rows[i]["owner"])) is not None}
            if driven:
                raise PetmodelError(_driven_here(driven))
            if active and not force:
                raise PetmodelError(_still_running(active, rows))
            self._delete_rows(conn, ids)
        self._remove_files(rows[i]["model_path"] for i in ids)
        self._remove_files(self._checkpoint_dir / f"{i}.state.pt" for i in ids)
        return ids

    def delete_study(self, study_id: str) -> list[str]:
        """Delete a finished study and all its runs (as :meth:`delete_runs`); the run ids deleted."""
        with self._write() as conn:
            study = conn.execute("SELECT status FROM studies WHERE id = ?", (study_id,)).fetchone()
            if study is None:
                raise PetmodelError(f"No study called {study_id!r} in the store.")
            if study["status"] in ACTIVE_STATUSES:
                raise PetmodelError(f"Study {study_id} is still {study['status']}; cancel it and wait until it "
                                    "stops before deleting it.")
            rows = {r["id"]: r for r in conn.execute("SELECT id, status, model_path FROM runs WHERE study_id = ?",
                                                    (study_id,))}
            active = [i for i, r in rows.items() if r["status"] in ACTIVE_STATUSES]
            if active:
                raise PetmodelError(f"Study {study_id} still has a run going ({_listed(active)}); wait until it "
                                    "stops before deleting the study.")
            self._delete_rows(conn, list(rows))
            conn.execute("DELETE FROM studies WHERE id = ?", (study_id,))
        self._remove_files(r["model_path"] for r in rows.values())
        self._remove_files(self._checkpoint_dir / f"{i}.state.pt" for i in rows)
        return list(rows)

    # ---- the parts
    @staticmethod
    def _runs_by_id(conn: sqlite3.Connection, ids: list[str]) -> dict[str, sqlite3.Row]:
        found: dict[str, sqlite3.Row] = {}
        for start in range(0, len(ids), 500):  # stay far below SQLite's variable limit
            chunk = ids[start:start + 500]
            marks = ", ".join("?" * len(chunk))
            for row in conn.execute(f"SELECT id, status, model_path, owner FROM runs WHERE id IN ({marks})", chunk):
                found[row["id"]] = row
        return found

    @staticmethod
    def _delete_rows(conn: sqlite3.Connection, ids: list[str]) -> None:
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marks = ", ".join("?" * len(chunk))
            conn.execute(f"DELETE FROM metrics WHERE run_id IN ({marks})", chunk)
            conn.execute(f"DELETE FROM runs WHERE id IN ({marks})", chunk)

    def _remove_files(self, paths: Iterable[str | Path | None]) -> None:
        """Remove each file that lies in this store's ``checkpoints/`` (relative paths are the store's)."""
        folder = self._checkpoint_dir.resolve()
        for path in paths:
            if not path:
                continue
            file = Path(path).expanduser()
            file = (file if file.is_absolute() else self._root / file).resolve()
            if file.parent == folder:
                file.unlink(missing_ok=True)


def _listed(ids: list[str]) -> str:
    """``'a'``, ``'a' and 'b'``, ``'a', 'b' and 'c'``: ids as a sentence names them."""
    quoted = [repr(i) for i in ids[:5]] + ([f"{len(ids) - 5} more"] if len(ids) > 5 else [])
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _still_running(ids: list[str], rows: dict[str, sqlite3.Row]) -> str:
    """The sentence refusing to delete queued or running runs that no live process on this host drives: their
    driver is on another host, or gone, which this host cannot tell apart; ``--force`` deletes them."""
    if len(ids) == 1:
        row = rows[ids[0]]
        return (f"Run {ids[0]} is still recorded {row['status']} ({describe_owner(row['owner'])}), and no process on "
                "this host drives it; cancel it where it runs, or if its driver is gone delete it anyway with "
                f"`python -m petmodel runs delete --force {ids[0]}`.")
    return (f"Runs {_listed(ids)} are still recorded queued or running, and no process on this host drives them; "
            "cancel them where they run, or if their drivers are gone delete them anyway with "
            f"`python -m petmodel runs delete --force {' '.join(ids) if len(ids) <= 5 else 'ID…'}`.")


def _driven_here(pids: dict[str, int]) -> str:
    """The sentence refusing to delete runs that a live process on this host still drives (even with force)."""
    ids = list(pids)
    if len(ids) == 1:
        return (f"Run {ids[0]} is still being trained by process {pids[ids[0]]} on this host; cancel it (Ctrl-C in "
                "its terminal, or Cancel run on the Train page) and wait until it stops before deleting it.")
    return (f"Runs {_listed(ids)} are still being trained by processes {', '.join(map(str, pids.values()))} on "
            "this host; cancel them and wait until they stop before deleting them.")
