"""Rows for the pages' tables, built from the store's records: plain data, no Streamlit.

Pages only lay these out (column labels and number formats stay with the page).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from petmodel.store import FINISHED_STATUSES, RunRecord

if TYPE_CHECKING:
    from petmodel.dist.workers import WorkerInfo

STUDY_PROGRESS_COLUMNS = ["#", "status", "configuration", "val NLL", "seconds", "run"]
LEADERBOARD_COLUMNS = ["trial", "status", "val_nll", "best", "lr", "batch_size", "hidden", "layers", "dropout",
                       "run_id", "error"]
_FINISHED_RANK_STATE = {"completed": "done", "cancelled": "cancelled", "pruned": "stopped"}


def last_row_per_rank(rows: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Each rank's latest row of ``rows`` (metric rows in insertion order)."""
    return {int(r.get("rank") or 0): r for r in rows}


def rank_table(run: RunRecord, last_rows: Mapping[int, Mapping[str, Any]],
               states: Mapping[int, str] | None = None) -> list[dict[str, Any]]:
    """One row per rank: worker, state, last step, samples, last seen (s since start), loss.

    ``last_rows`` maps rank → its latest train metric row; ``states`` the task states of a run
    this process drives (``RunHandle.rank_states``). Without them (a run that ended, or one
    driven elsewhere) the state follows from the run's status: when a run fails, the worker
    that caused it is "failed" and the others were "stopped".
    """
    states = dict(states or {})
    n = max(len(run.workers), (max(last_rows) + 1) if last_rows else 0, 1)
    rows = []
    for rank in range(n):
        worker = run.workers[rank] if rank < len(run.workers) else None
        state = states.get(rank)
        if state is None:
            if run.status == "failed":
                state = "failed" if worker and worker == run.failed_worker else "stopped"
            elif run.status in FINISHED_STATUSES:
                state = _FINISHED_RANK_STATE.get(run.status)
            else:
                state = "training"
        last = last_rows.get(rank) or {}
        if state == "training" and not last:
            state = "starting"
        rows.append({"rank": rank, "worker": worker or "—", "state": state, "step": last.get("step"),
                     "samples": last.get("samples"), "last_seen_s": last.get("elapsed"),
                     "loss": last.get("loss")})
    return rows


def worker_rows(workers: Iterable[WorkerInfo], busy: set[str]) -> list[dict[str, Any]]:
    """The Cluster page's workers table: host, address, threads, memory, GPUs, whether a run holds it."""
    return [{"address": w.address, "host": w.host, "threads": w.nthreads,
             "memory_gib": round(w.memory_limit / 2**30, 1) if w.memory_limit else None,
             "gpu": f"{w.gpu_count} × {w.gpu_name}" if w.gpu_count else "none",
             "busy": w.address in busy} for w in workers]


def _trial_label(item: Mapping[str, Any], kind: str) -> str:
    if kind == "sweep":
        return item.get("label") or ""
    p = item.get("params")
    if not p:
        return "not started yet"
    return (f"lr {p['lr']:.4g} · batch {p['batch_size']} · hidden {p['hidden']} · layers {p['layers']} · "
            f"dropout {p['dropout']:.2f}")


def study_progress_frame(items: Sequence[Mapping[str, Any]], kind: str) -> pd.DataFrame:
    """One row per run of a sweep (``kind`` "sweep") or trial of a search: number, status, what it tries, result."""
    rows = [{"#": item.get("index", item.get("number")), "status": item.get("status"),
             "configuration": _trial_label(item, kind), "val NLL": item.get("val_nll"),
             "seconds": item.get("duration"), "run": item.get("run_id")} for item in items]
    return pd.DataFrame(rows, columns=STUDY_PROGRESS_COLUMNS)


def leaderboard_frame(board: Sequence[Mapping[str, Any]], best_run_id: str | None) -> pd.DataFrame:
    """A search's trials, best first (as ``search_leaderboard`` orders them), the best one starred."""
    rows = [{"trial": i.get("number"), "status": i.get("status"), "val_nll": i.get("val_nll"),
             "best": "★" if best_run_id and i.get("run_id") == best_run_id else "",
             **{k: (i.get("params") or {}).get(k) for k in ("lr", "batch_size", "hidden", "layers", "dropout")},
             "run_id": i.get("run_id"), "error": i.get("error")} for i in board]
    return pd.DataFrame(rows, columns=LEADERBOARD_COLUMNS)


def scaling_groups(rows: pd.DataFrame, equivalent: bool) -> pd.Series:
    """Each sweep row's group of comparable runs, as a label: its batch (global or per worker) and lr."""
    column = "global_batch" if equivalent else "batch_per_worker"
    scope = "global" if equivalent else "per worker"
    return rows.apply(lambda r: f"{scope} {r[column]} · lr {r['lr']:g}", axis=1)
