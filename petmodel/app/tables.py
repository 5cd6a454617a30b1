"""Rows for the pages' tables, built from the store's records: plain data, no Streamlit.

Pages only lay these out (column labels and number formats stay with the page).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from petmodel.analysis import format_seconds
from petmodel.config import counted
from petmodel.status import RankState, RunStatus
from petmodel.store import FINISHED_STATUSES, RunRecord

if TYPE_CHECKING:
    from petmodel.cluster.workers import WorkerInfo

STUDY_PROGRESS_COLUMNS = ["#", "status", "configuration", "val NLL", "seconds", "run"]
LEADERBOARD_COLUMNS = ["trial", "status", "val_nll", "best", "lr", "batch_size", "hidden", "layers", "dropout",
                       "run_id", "error"]
_FINISHED_RANK_STATE = {RunStatus.COMPLETED: RankState.DONE, RunStatus.CANCELLED: RankState.CANCELLED,
                        RunStatus.PRUNED: RankState.STOPPED}
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


def fmt_ago(value: Any) -> str:
    """Seconds since something happened: "2 s ago", "3 min 05 s ago"."""
    if missing(value):
        return BLANK
    seconds = max(0, round(float(value)))
    return f"{seconds} s ago" if seconds < 60 else f"{format_seconds(seconds)} ago"


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
               states: Mapping[int, str] | None = None, now: float | None = None) -> list[dict[str, Any]]:
    """One row per rank: worker, state, last step, this rank's samples, last heartbeat, loss.

    ``rank_samples`` is the rank's own count (ranks get unequal, work-balanced slices), blank for
    rows stored before the store kept it. ``heartbeat_s`` is how long ago (from ``now``, default
    the clock) the store last heard from the rank: filled only while the run is going, since a
    finished run's ranks are silent by design.

    ``last_rows`` maps rank → its latest train metric row; ``states`` the task states of a run
    this process drives (``RunHandle.rank_states``). Without them (a run that ended, or one
    driven elsewhere) the state follows from the run's status: when a run fails, the worker
    that caused it is "failed" and the others were "stopped".

    Workers the run lost (it re-formed without them) follow as rows of their own, state "lost
    at step N". A run that re-formed or resumed has rows of an older, larger group in its
    metrics; only ``run.workers``, the group as it trains now, are live ranks.
    """
    states = dict(states or {})
    clock = time.time() if now is None else now
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
                state = RankState.FAILED if worker and worker == run.failed_worker else RankState.STOPPED
            elif run.status in FINISHED_STATUSES:
                state = _FINISHED_RANK_STATE.get(run.status)
            else:
                state = RankState.TRAINING
        last = last_rows.get(rank) or {}
        if state == RankState.TRAINING and not last:
            state = RankState.STARTING
        heard = last.get("recorded")
        rows.append({"rank": rank, "worker": worker or "—", "state": state, "step": last.get("step"),
                     "rank_samples": last.get("rank_samples"),
                     "heartbeat_s": None if run.is_finished or missing(heard) else max(0.0, clock - float(heard)),
                     "loss": last.get("loss")})
    for lost in run.lost_workers:
        at = lost.get("failed_step") if lost.get("failed_step") is not None else lost.get("step")
        rows.append({"rank": lost.get("rank"), "worker": lost.get("worker") or "—",
                     "state": f"lost at step {at}" if at is not None else RankState.LOST, "step": at, "rank_samples": None,
                     "heartbeat_s": None, "loss": None})
    return rows


LIVE_RATE_WINDOW_S = 5.0  # the live rate: samples over about the last this many training seconds


@dataclass(frozen=True)
class Rate:
    """A run's samples per second and what it measures: "live, last 5 s", "average so far", "run average"."""

    value: float | None
    basis: str


def run_rate(run: RunRecord, train_rows: Sequence[Mapping[str, Any]],
             window_s: float = LIVE_RATE_WINDOW_S) -> Rate:
    """Samples per second over all workers: live (the last ``window_s`` training seconds) while the run
    trains, the run's average once it ended, so the number never changes meaning without saying so."""
    if run.is_finished:
        result = run.result or {}
        value = result.get("samples_per_s")
        if missing(value) and run.samples and run.train_seconds:
            value = run.samples / run.train_seconds
        return Rate(None if missing(value) else float(value), "run average")
    rows = sorted((r for r in train_rows if int(r.get("rank") or 0) == 0 and not missing(r.get("elapsed"))
                   and not missing(r.get("samples"))), key=lambda r: float(r["elapsed"]))
    if not rows:
        return Rate(None, "live")
    last = rows[-1]
    first = next(r for r in rows if float(r["elapsed"]) >= float(last["elapsed"]) - window_s)
    span = float(last["elapsed"]) - float(first["elapsed"])
    if span > 0:
        return Rate((float(last["samples"]) - float(first["samples"])) / span, f"live, last {window_s:g} s")
    average = last.get("samples_per_s")
    return Rate(None if missing(average) else float(average), "average so far")


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
            return (f"{counted(int(item['workers']), 'worker')} × batch {item.get('batch_per_worker')} = "
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
            label = counted(int(i.get("workers") or 1), "worker")
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


def study_fraction(finished: int, total: int, running: int, running_s: float, seconds_per_run: float) -> float:
    """How far a study is, 0..1, moving within a run: finished runs plus the running ones' share of their budget
    (a study of two runs no longer sits at 0 through its whole first run)."""
    if total <= 0:
        return 0.0
    within = min(1.0, running_s / seconds_per_run) if seconds_per_run > 0 else 0.0
    return min(1.0, (finished + running * within) / total)


def estimated_study_seconds(runs: int, seconds_per_run: float, parallel: int = 1,
                            overhead_s: float = 5.0) -> float:
    """Roughly how long a study of ``runs`` runs takes: budgets ``parallel`` at a time, plus start-up per run."""
    waves = math.ceil(max(0, runs) / max(1, parallel))
    return waves * (seconds_per_run + overhead_s)


# --------------------------------------------------------------------------- column headers
# What every table column is called on the pages, with its unit, and a tooltip where the name alone
# is not enough: one vocabulary for Compare, Experiments and Train (no snake_case header anywhere).
COLUMN_LABELS: dict[str, tuple[str, str | None]] = {
    "run_id": ("Run", None), "run": ("Run", None), "name": ("Name", None), "status": ("Status", None),
    "note": ("Note", "What the run is for, as given at launch or with `runs note`."),
    "data": ("Data", "The data the run trained on."), "workers": ("Workers", "DDP ranks, one per Dask worker."),
    "batch_per_worker": ("Batch/worker", "Names per step on each worker."),
    "batch_size": ("Batch/worker", "Names per step on each worker."),
    "global_batch": ("Global batch", "Names per step over all workers."), "lr": ("Learning rate", None),
    "epochs": ("Epochs", "The epoch limit; blank: none."), "max_seconds": ("Budget", "The time budget; blank: none."),
    "embed": ("Embedding", None), "hidden": ("Hidden", None), "layers": ("Layers", None),
    "dropout": ("Dropout", None), "seed": ("Seed", None), "precision": ("Precision", None),
    "backend": ("Backend", "torch.distributed's backend."),
    "best_val_nll": ("Best val NLL", "Validation NLL in nats per character; lower is better."),
    "val_nll": ("Val NLL", "Validation NLL in nats per character; lower is better."),
    "val NLL": ("Val NLL", "Validation NLL in nats per character; lower is better."),
    "train_seconds": ("Train time", None), "seconds": ("Time", None),
    "samples": ("Samples", "Names seen by all workers."),
    "samples_per_s": ("Samples/s", "Names per second, all workers."),
    "error": ("Error", None), "time_to_target": ("Time to target", None), "baseline_id": ("Baseline", None),
    # the forecast tables: short headers, so all ten columns fit 1400 px
    "step_ms": ("Step ms", "Forecast time of one step."), "step_range_ms": ("Step range ms", None),
    "forecast_speedup": ("Forecast ×", None), "speedup_range": ("Range ×", None),
    "time_to_target_s": ("To target s", "Forecast training time to the target NLL."), "basis": ("Basis", None),
    "wall_time_to_target": ("Wall time to target", "Including the validation pauses."),
    "samples_to_target": ("Samples to target", "Names seen by all workers when the target was first reached."),
    "speedup": ("Speedup ×", "Over one worker."), "ideal": ("Ideal ×", "Speedup = workers."),
    "efficiency": ("Efficiency", "Speedup ÷ workers."),
    "background_cpu": ("Background CPU", "Cores other processes used while the run trained."),
    "steal_cpu": ("CPU steal", "Cores the hypervisor took while the run trained."),
    "trial": ("Trial", None), "best": ("Best", None), "#": ("#", None), "configuration": ("Configuration", None),
    "rank": ("Rank", None), "worker": ("Worker", None), "state": ("State", None), "step": ("Step", None),
    "rank_samples": ("Samples (this rank)", "Names this rank trained on; ranks get unequal, work-balanced slices."),
    "heartbeat_s": ("Last heartbeat", "How long ago the store last heard from this rank."),
    "loss": ("Loss", "Training loss in nats per character."),
}
# Widths in pixels of the columns whose cells are longer than their header; the main area is about
# MAIN_WIDTH_PX wide in a 1400 px window with the sidebar open, and a page's default columns fit in it.
MAIN_WIDTH_PX = 940
WIDE_COLUMNS = {"run_id": 150, "run": 150, "error": 180, "configuration": 300, "name": 110, "data": 160,
                "worker": 170, "note": 180}
CHAR_PX, HEADER_PAD_PX = 7, 28  # a header character, and the padding and sort mark beside it


def column_config(columns: Iterable[str], tips: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``st.dataframe``'s ``column_config`` for ``columns``: human labels, tooltips, widths that show the label.

    Plain dicts (Streamlit's ``ColumnConfig`` is a TypedDict), so no Streamlit here. ``tips``
    overrides a column's tooltip (e.g. which clock a time measures on this page). A column not
    in :data:`COLUMN_LABELS` is labelled from its name, underscores as spaces.
    """
    out: dict[str, dict[str, Any]] = {}
    for column in columns:
        label, tip = COLUMN_LABELS.get(column, (str(column).replace("_", " ").capitalize(), None))
        tip = (tips or {}).get(column, tip)
        width = WIDE_COLUMNS.get(column, CHAR_PX * len(label) + HEADER_PAD_PX)
        out[column] = {"label": label, "width": width, **({"help": tip} if tip else {})}
    return out


def table_width(columns: Iterable[str]) -> int:
    """The pixels the columns of :func:`column_config` take side by side."""
    return sum(c["width"] for c in column_config(columns).values())


# Each page's default columns (the rest one toggle away): they fit MAIN_WIDTH_PX.
COMPARE_COLUMNS = ["run_id", "name", "workers", "global_batch", "lr", "best_val_nll", "train_seconds",
                   "samples_per_s"]  # Compare adds Status when not all completed (errors go below it)
SWEEP_COLUMNS = ["workers", "batch_per_worker", "global_batch", "val_nll", "time_to_target", "speedup", "efficiency",
                 "run_id"]
RECENT_COLUMNS = ["run_id", "name", "status", "workers", "lr", "best_val_nll", "train_seconds", "error"]
