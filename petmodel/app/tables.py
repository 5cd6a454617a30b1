"""Rows for the pages' tables, built from the store's records: plain data, no Streamlit.

Pages only lay these out (column labels and number formats stay with the page).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from petmodel.analysis import format_seconds
from petmodel.status import RunStatus
from petmodel.store import FINISHED_STATUSES, RunRecord

if TYPE_CHECKING:
    from petmodel.cluster.workers import WorkerInfo

STUDY_PROGRESS_COLUMNS = ["#", "status", "configuration", "val NLL", "seconds", "run"]
LEADERBOARD_COLUMNS = ["trial", "status", "val_nll", "best", "lr", "batch_size", "hidden", "layers", "dropout",
                       "run_id", "error"]
_FINISHED_RANK_STATE = {RunStatus.COMPLETED: "done", RunStatus.CANCELLED: "cancelled", RunStatus.PRUNED: "stopped"}
BLANK = "—"  # what an empty cell reads as: never "None" or "nan"
# An absolute path (POSIX or Windows) inside a message: visitors see only its last part.
_PATH = re.compile(r"(?<![\w:/])(?:/|[A-Za-z]:\\)(?:[^\s/\\'\"]+[/\\])+([^\s/\\'\"]*)")


def missing(value: Any) -> bool:
    """None, NaN or pandas' NA/NaT: a cell with nothing to show."""
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def fmt_number(fmt: str) -> Callable[[Any], str]:
    """A cell formatter from a format spec (``"{:.3f}"``-style body, e.g. ``".3f"``, ``".0%"``, ``",d"``)."""
    def cell(value: Any) -> str:
        if missing(value):
            return BLANK
        try:
            return format(int(value) if fmt.endswith("d") else float(value), fmt)
        except (TypeError, ValueError):
            return str(value)
    return cell


def fmt_secs(value: Any) -> str:
    """Seconds as people read them: "40 s", "2.5 s", "3 min 05 s"."""
    return BLANK if missing(value) else format_seconds(value)


def without_paths(text: Any) -> str:
    """``text`` with every absolute path cut to its last part, so visitors never see where files live."""
    return _PATH.sub(lambda m: m.group(1) or "…", str(text))


def readable(frame: pd.DataFrame, formats: Mapping[str, Callable[[Any], str]] | None = None) -> pd.DataFrame:
    """A copy of ``frame`` for display: every cell a string, blanks as "—", paths cut from text.

    ``formats`` maps a column to its cell formatter (:func:`fmt_number`, :func:`fmt_secs`);
    other numbers print without trailing zeros. Keep the raw frame for CSV downloads.
    """
    formats = dict(formats or {})

    def plain(value: Any) -> str:
        if missing(value):
            return BLANK
        if isinstance(value, float):
            return f"{value:g}" if math.isfinite(value) else BLANK
        return without_paths(value) if isinstance(value, str) else str(value)

    out = pd.DataFrame(index=frame.index)
    for column in frame.columns:
        out[column] = frame[column].map(formats.get(column, plain)).astype(str)
    return out


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

    Workers the run lost (it re-formed without them) follow as rows of their own, state "lost
    at step N". A run that re-formed or resumed has rows of an older, larger group in its
    metrics; only ``run.workers``, the group as it trains now, are live ranks.
    """
    states = dict(states or {})
    if run.workers and (run.lost_workers or run.resumed_from):
        n = len(run.workers)
    else:
        n = max(len(run.workers), (max(last_rows) + 1) if last_rows else 0, 1)
    rows = []
    for rank in range(n):
        worker = run.workers[rank] if rank < len(run.workers) else None
        state = states.get(rank)
        if state is None:
            if run.status == RunStatus.FAILED:
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
    for lost in run.lost_workers:
        at = lost.get("failed_step") if lost.get("failed_step") is not None else lost.get("step")
        rows.append({"rank": lost.get("rank"), "worker": lost.get("worker") or "—",
                     "state": f"lost at step {at}" if at is not None else "lost", "step": at, "samples": None,
                     "last_seen_s": None, "loss": None})
    return rows


def restart_note(run: RunRecord) -> str | None:
    """The status line's word on restarts: "restarted 1×" (None when the run never re-formed)."""
    return f"restarted {run.restarts}×" if run.restarts else None


def lost_workers_text(run: RunRecord) -> str | None:
    """One sentence naming each worker the run lost and the step it re-formed from (None if none)."""
    if not run.lost_workers:
        return None
    parts = []
    for lost in run.lost_workers:
        rank = f" (rank {lost['rank']})" if lost.get("rank") is not None else ""
        failed = f" at step {lost['failed_step']}" if lost.get("failed_step") is not None else ""
        parts.append(f"{lost.get('worker') or 'a worker'}{rank}{failed}, re-formed from step {lost.get('step', 0)}")
    return "Lost " + "; ".join(parts) + "."


def worker_rows(workers: Iterable[WorkerInfo], busy: set[str]) -> list[dict[str, Any]]:
    """The Cluster page's workers table: host, address, threads, memory, GPUs, whether a run holds it."""
    return [{"address": w.address, "host": w.host, "threads": w.nthreads,
             "memory_gib": round(w.memory_limit / 2**30, 1) if w.memory_limit else None,
             "gpu": f"{w.gpu_count} × {w.gpu_name}" if w.gpu_count else "none",
             "busy": w.address in busy} for w in workers]


def _trial_label(item: Mapping[str, Any], kind: str) -> str:
    if kind == "sweep":
        if item.get("workers") and item.get("global_batch") and item.get("lr") is not None:
            return (f"{workers_words(int(item['workers']))} × batch {item.get('batch_per_worker')} = "
                    f"{item['global_batch']}, lr {float(item['lr']):g}")
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


def workers_words(n: int) -> str:
    """ "1 worker", "2 workers"."""
    return f"{n} worker{'' if n == 1 else 's'}"


def study_run_labels(items: Sequence[Mapping[str, Any]], kind: str, best_run_id: str | None = None) -> dict[str, str]:
    """Legend labels of a study's runs: "1 worker", "2 workers" (sweep) or "trial 2 ★ best" (search).

    A sweep whose workers count repeats (several batches or learning rates) adds what differs.
    """
    runs = [i for i in items if i.get("run_id")]
    if kind == "sweep":
        counts: dict[Any, int] = {}
        for i in runs:
            counts[i.get("workers")] = counts.get(i.get("workers"), 0) + 1
        labels = {}
        for i in runs:
            label = workers_words(int(i.get("workers") or 1))
            if counts[i.get("workers")] > 1:
                label += f" · batch {i.get('global_batch')} · lr {float(i.get('lr') or 0):g}"
            labels[i["run_id"]] = label
        return labels
    return {i["run_id"]: f"trial {i.get('number')}" + (" ★ best" if i["run_id"] == best_run_id else "")
            for i in runs}


def study_eta(items: Sequence[Mapping[str, Any]], seconds_per_run: float, parallel: int = 1,
              elapsed_running: float = 0.0) -> tuple[int, int, float | None]:
    """(finished runs, planned runs, seconds left) of a study from its items and each run's time budget.

    Queued runs take a full budget each, ``parallel`` at a time; running ones what is left of
    theirs (``elapsed_running``: the longest a running one has run). None when nothing is planned.
    """
    total = len(items)
    finished = sum(1 for i in items if i.get("status") in FINISHED_STATUSES)
    queued = sum(1 for i in items if i.get("status") == RunStatus.QUEUED)
    running = sum(1 for i in items if i.get("status") == RunStatus.RUNNING)
    if not total:
        return 0, 0, None
    left = max(0.0, seconds_per_run - elapsed_running) if running else 0.0
    left += math.ceil(queued / max(1, parallel)) * seconds_per_run
    return finished, total, left


def estimated_study_seconds(runs: int, seconds_per_run: float, parallel: int = 1,
                            overhead_s: float = 5.0) -> float:
    """Roughly how long a study of ``runs`` runs takes: budgets ``parallel`` at a time, plus start-up per run."""
    waves = math.ceil(max(0, runs) / max(1, parallel))
    return waves * (seconds_per_run + overhead_s)
