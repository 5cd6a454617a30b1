"""Numbers the app's pages (and the experiment studies) derive from the run store.

Pure functions over run records and metric frames: no Streamlit, no cluster, no I/O. The
pages only lay out what these return, so everything that can be wrong in a figure is tested
here without a browser.

- :func:`default_target`: a target NLL every given run reached (the figures at a target live in
  :mod:`petmodel.comparison`, their one home);
- :func:`run_progress`: fraction done and ETA of a running run from its stop rules;
- :func:`curve_frame`, :func:`runs_table`: tidy frames for loss charts and config tables;
- :func:`run_data_label`: which data a run used, without its path;
- :func:`run_workers`, :func:`run_where`, :func:`workers_label`: how many workers a run used (1 for
  in-process) and where it trained;
- :func:`rounded`: a number as the JSON rows and study tables give it (None when missing or not finite).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from petmodel.config import counted
from petmodel.status import RunStatus

if TYPE_CHECKING:  # pandas is heavy; imported inside the functions that build frames
    import pandas as pd

__all__ = [
    "Progress",
    "curve_frame",
    "default_target",
    "run_data_label",
    "run_progress",
    "rounded",
    "run_where",
    "run_workers",
    "runs_table",
    "workers_label",
]

# --------------------------------------------------------------------------- small accessors
def _get(run: Any, name: str, default: Any = None) -> Any:
    """A field of a RunRecord or of a plain mapping with the same keys."""
    if isinstance(run, Mapping):
        return run.get(name, default)
    return getattr(run, name, default)


def _run_id(run: Any) -> str:
    return str(_get(run, "id") or _get(run, "run_id"))


def run_workers(run: Any) -> int:
    """How many workers a run used: the DDP ranks it was launched with, 1 for a run trained in-process.

    The one answer to "how many workers did this run use", everywhere: the CLI's ``workers`` (train
    and runs), the sweep's rows, the speedup grouping, the pages' labels (:func:`workers_label`).
    Training in this process is training on one worker (one rank, the whole batch), so an
    in-process run is the 1-worker baseline of every speedup and its global batch is its batch.
    A run that lost a worker and re-formed keeps its count: it trains on with the same global
    batch, so it stays an N-worker run in every comparison (``run.workers`` lists the group it
    trains with now, ``run.lost_workers`` the ones it lost). A row without the setting counts its
    recorded worker addresses; an in-process run's placeholder address, "local", is not a worker.
    """
    if run_where(run) == "in-process":
        return 1
    config = _get(run, "config") or {}
    value = config.get("workers") if isinstance(config, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    workers = _get(run, "workers") or []
    count = sum(1 for w in workers if w != "local") if isinstance(workers, (list, tuple)) else 0
    return max(1, count)


def run_where(run: Any) -> str:
    """Where a run trained: "in-process" (this process, no Dask) or "cluster" (DDP on Dask workers).

    The store marks an in-process run with the backend "local"; before it starts, its spec's
    ``workers`` of 0 says the same.
    """
    if _get(run, "backend") == "local":
        return "in-process"
    config = _get(run, "config") or {}
    value = config.get("workers") if isinstance(config, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return "cluster" if value >= 1 else "in-process"
    workers = _get(run, "workers") or []
    real = [w for w in workers if w != "local"] if isinstance(workers, (list, tuple)) else []
    return "cluster" if real else "in-process"


def workers_label(run: Any) -> str:
    """:func:`run_workers` and :func:`run_where` as people read them: "in-process", "1 worker", "2 workers"."""
    if run_where(run) == "in-process":
        return "in-process"
    return counted(run_workers(run), "worker")


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def rounded(value: Any, digits: int) -> float | None:
    """``value`` as a float rounded to ``digits``, or None when it is missing or not finite (JSON-safe)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return round(f, digits) if math.isfinite(f) else None


# --------------------------------------------------------------------------- targets
def _val_points(metrics: pd.DataFrame, run_id: str) -> list[tuple[float, float]]:
    if metrics is None or len(metrics) == 0:
        return []
    rows = metrics[(metrics["run_id"] == run_id) & metrics["val_nll"].notna()]
    if "kind" in rows:
        rows = rows[(rows["kind"] == "val") | rows["kind"].isna()]
    return list(zip(rows["elapsed"].astype(float), rows["val_nll"].astype(float)))


def default_target(runs: Sequence[Any], metrics: pd.DataFrame) -> float | None:
    """A target every given run with validation points reached: the worst of their best NLLs.

    Rounded up to 0.01 so the number reads well in a form. None when no run has points.
    """
    bests = []
    for run in runs:
        values = [v for _, v in _val_points(metrics, _run_id(run))]
        if values:
            bests.append(min(values))
    if not bests:
        return None
    return math.ceil(max(bests) * 100 - 1e-9) / 100


def run_data_label(run: Any) -> str:
    """The data a run trained on, as a path-free label (the recorded source, else the one it asked for)."""
    from petmodel.sources import default_source, describe_source

    result = _get(run, "result") or {}
    data = result.get("data") if isinstance(result, Mapping) else None
    source = data.get("data_source") if isinstance(data, Mapping) else None
    if not source:
        config = _get(run, "config") or {}
        source = config.get("data") if isinstance(config, Mapping) else None
    return describe_source(source) if source else default_source().label  # the label a finished run gets too


# --------------------------------------------------------------------------- progress and ETA
@dataclass(frozen=True)
class Progress:
    """Where a run stands: ``fraction`` in [0, 1], ``eta_s`` (None if unknown), and a sentence."""

    fraction: float
    eta_s: float | None
    elapsed_s: float
    step: int
    epoch: float
    text: str


def format_seconds(seconds: float) -> str:
    """Seconds as people read them: "0.05 s", "2.5 s", "40 s", "3 min 05 s", "1 h 02 min" (one format everywhere).

    Under a second two decimals: a tiny study's times to target (0.05 s against 0.10 s) would both
    read "0.0 s"/"0.1 s" beside a chart that shows them apart."""
    seconds = max(0.0, float(seconds))
    if seconds < 0.995:
        return f"{seconds:.2f} s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def run_progress(run: Any, last_train_row: Mapping[str, Any] | None, *, now: float | None = None) -> Progress:
    """Progress of a run from its stop rules (time budget, epochs, max steps) and its last metric row.

    Training stops at whichever rule is met first, so the fraction is the largest of
    elapsed / budget, epochs done / epochs and steps / max steps; the ETA is the time the
    leading rule still needs at the pace so far (exact for a time budget).
    """
    config = _get(run, "config") or {}
    train = config.get("train", {}) if isinstance(config, Mapping) else {}
    status = _get(run, "status") or RunStatus.RUNNING
    started = _get(run, "started")
    finished = _get(run, "finished")
    row = last_train_row or {}
    step = int(row.get("step") or 0)
    epoch = float(row.get("epoch") or 0.0)
    if _finite(row.get("elapsed")):
        elapsed = float(row["elapsed"])
    elif started:
        elapsed = max(0.0, (finished or (now or time.time())) - float(started))
    else:
        elapsed = 0.0
    if status == RunStatus.COMPLETED:
        return Progress(1.0, 0.0, elapsed, step, epoch, f"Completed in {format_seconds(elapsed)}.")
    if status in (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.PRUNED):
        return Progress(0.0 if not step else _fraction(train, elapsed, epoch, step)[0], None, elapsed, step, epoch,
                        f"{str(status).capitalize()} after {format_seconds(elapsed)}.")
    if not step:
        return Progress(0.0, None, elapsed, 0, 0.0, "Starting the workers…")
    fraction, eta = _fraction(train, elapsed, epoch, step)
    if fraction >= 1.0:
        return Progress(1.0, 0.0, elapsed, step, epoch, "Finishing: last validation and saving the model…")
    text = f"{fraction:.0%} done, about {format_seconds(eta)} left" if eta is not None else f"{fraction:.0%} done"
    return Progress(fraction, eta, elapsed, step, epoch, text + f" (step {step:,}, epoch {epoch:.2f}).")


def _fraction(train: Mapping[str, Any], elapsed: float, epoch: float, step: int) -> tuple[float, float | None]:
    candidates: list[tuple[float, float | None]] = []
    max_seconds = train.get("max_seconds")
    if _finite(max_seconds) and float(max_seconds) > 0:
        candidates.append((elapsed / float(max_seconds), float(max_seconds) - elapsed))
    epochs = train.get("epochs")
    if _finite(epochs) and float(epochs) > 0 and epoch > 0:
        f = epoch / float(epochs)
        candidates.append((f, elapsed * (1 - f) / f))
    max_steps = train.get("max_steps")
    if _finite(max_steps) and float(max_steps) > 0 and step > 0:
        f = step / float(max_steps)
        candidates.append((f, elapsed * (1 - f) / f))
    if not candidates:
        return 0.0, None
    fraction, eta = max(candidates, key=lambda c: c[0])
    return min(1.0, max(0.0, fraction)), None if eta is None else max(0.0, eta)


# --------------------------------------------------------------------------- frames for pages
def curve_frame(runs: Sequence[Any], metrics: pd.DataFrame, *, kind: str = "train",
                max_points: int = 1500, rank0_only: bool = True) -> pd.DataFrame:
    """Tidy points for loss charts: run_id, label, workers, rank, step, elapsed, samples, value.

    ``samples`` is global (this rank's samples × the run's workers). ``value`` is the train
    loss (kind "train") or the validation NLL (kind "val"). Each run is thinned to about
    ``max_points`` evenly spaced rows so a long run still draws quickly.
    """
    import pandas as pd

    columns = ["run_id", "label", "workers", "rank", "step", "elapsed", "samples", "value"]
    if metrics is None or len(metrics) == 0:
        return pd.DataFrame(columns=columns)
    parts = []
    for run in runs:
        rid = _run_id(run)
        rows = metrics[metrics["run_id"] == rid]
        if kind == "val":
            rows = rows[rows["val_nll"].notna()]
            value = rows["val_nll"]
        else:
            rows = rows[(rows["kind"] == "train") & rows["loss"].notna()]
            if rank0_only:
                rows = rows[rows["rank"].fillna(0) == 0]
            value = rows["loss"]
        if rows.empty:
            continue
        workers = run_workers(run)
        part = pd.DataFrame({
            "run_id": rid,
            "label": f"{_get(run, 'name') or rid} ({counted(workers, 'worker')})",
            "workers": workers,
            "rank": rows["rank"].fillna(0).astype("int64").to_numpy(),
            "step": rows["step"].fillna(0).astype("int64").to_numpy(),
            "elapsed": rows["elapsed"].astype(float).to_numpy(),
            "samples": rows["samples"].fillna(0).astype("int64").to_numpy(),
            "value": value.astype(float).to_numpy(),
        })
        if len(part) > max_points:
            stride = math.ceil(len(part) / max_points)
            keep = list(range(0, len(part), stride))
            if keep[-1] != len(part) - 1:
                keep.append(len(part) - 1)
            part = part.iloc[keep]
        parts.append(part)
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True)[columns]


def _samples_per_s(run: Any, result: Any) -> float | None:
    if isinstance(result, Mapping) and _finite(result.get("samples_per_s")):
        return float(result["samples_per_s"])
    samples, seconds = _get(run, "samples"), _get(run, "train_seconds")
    if _finite(samples) and _finite(seconds) and float(seconds) > 0:
        return round(float(samples) / float(seconds), 1)
    return None


def runs_table(runs: Sequence[Any]) -> pd.DataFrame:
    """One row per run: its configuration and results, for tables and CSV downloads."""
    import pandas as pd

    rows = []
    for run in runs:
        config = _get(run, "config") or {}
        train = config.get("train", {}) or {}
        result = _get(run, "result") or {}
        best = _get(run, "best_val_nll")
        if best is None:
            best = _get(run, "val_nll")
        rows.append({
            "run_id": _run_id(run),
            "name": _get(run, "name"),
            "note": _get(run, "note"),
            "status": _get(run, "status"),
            "data": run_data_label(run),
            "workers": run_workers(run),
            "batch_per_worker": train.get("batch_size"),
            "global_batch": config.get("global_batch"),
            "lr": train.get("lr"),
            "epochs": train.get("epochs"),
            "max_seconds": train.get("max_seconds"),
            "embed": config.get("embed"),
            "hidden": config.get("hidden"),
            "layers": config.get("layers"),
            "dropout": config.get("dropout"),
            "seed": train.get("seed"),
            "precision": train.get("precision"),
            "backend": _get(run, "backend"),
            "best_val_nll": best,
            "train_seconds": _get(run, "train_seconds"),
            "samples": _get(run, "samples"),
            "samples_per_s": _samples_per_s(run, result),
            "error": _get(run, "error"),
        })
    return pd.DataFrame(rows, columns=[
        "run_id", "name", "note", "status", "data", "workers", "batch_per_worker", "global_batch", "lr", "epochs",
        "max_seconds", "embed", "hidden", "layers", "dropout", "seed", "precision", "backend", "best_val_nll",
        "train_seconds", "samples", "samples_per_s", "error"])
