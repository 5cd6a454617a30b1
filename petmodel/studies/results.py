"""What a study's runs say, read back from the run store: the sweep's scaling table, loss curves, live progress.

Works for studies driven by any process (the CLI, the app): everything comes from the store,
plus the live handle when this process drives the study.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from petmodel.analysis import rounded, run_workers
from petmodel.comparison import time_to_target, training_clock
from petmodel.errors import PetmodelError
from petmodel.status import ACTIVE, RunStatus
from petmodel.studies.defaults import DEFAULT_TARGET_NLL
from petmodel.studies.handle import get_study_handle

if TYPE_CHECKING:
    import pandas as pd

    from petmodel.store import RunRecord, RunStore


def sweep_table(store: RunStore, study_id: str, target_nll: float | None = None) -> list[dict[str, Any]]:
    """One row per run of a sweep: its configuration, time to the target, speedup and efficiency.

    The figures are :mod:`petmodel.comparison`'s, as on every page: time to the target on the training
    clock (validation pauses left out, ``wall_time_to_target`` with them), interpolated between the validations
    either side of it; speedup against the group's own 1-worker run only. Runs are grouped by the optimisation
    they share: the same global batch and learning rate in an equivalent sweep (the 1-worker run is then
    an equivalent baseline); the same per-worker batch and rate in a non-equivalent one, which the user
    asked for, so its speedups are against the group's 1-worker run and flagged as not equivalent.
    """
    from petmodel.comparison import compare_runs

    study = store.get_study(study_id)
    if study is None:
        raise PetmodelError(f"No study called {study_id!r} in the store {store.root}.")
    config = study.config or {}
    target = float(target_nll if target_nll is not None else config.get("target_nll", DEFAULT_TARGET_NLL))
    equivalent = bool(config.get("equivalent", True))
    runs = sorted(store.list_runs(study_id=study_id), key=lambda r: r.created)
    if not runs:
        return []
    frame = store.metrics_frame([r.id for r in runs])
    groups: dict[tuple[int, float], list[RunRecord]] = {}
    for run in runs:
        train = (run.config or {}).get("train", {})
        bpw = int(train.get("batch_size") or 0)
        key = (bpw * run_workers(run) if equivalent else bpw, float(train.get("lr") or 0.0))
        groups.setdefault(key, []).append(run)
    rows: list[dict[str, Any]] = []
    for key in sorted(groups):
        group = sorted(groups[key], key=lambda r: (run_workers(r), r.created))
        ones = [r for r in group if run_workers(r) == 1]
        forced = None if equivalent or not ones else ones[-1]
        figures = {f.run_id: f for f in compare_runs(group, frame, target, candidates=group, baseline=forced)}
        for run in group:
            train = run.config.get("train", {})
            workers = run_workers(run)
            f = figures[run.id]
            rows.append({
                "workers": workers, "global_batch": int(train.get("batch_size", 0)) * workers,
                "batch_per_worker": int(train.get("batch_size", 0)), "lr": float(train.get("lr", 0.0)),
                "seed": train.get("seed"), "run_id": run.id, "status": run.status, "val_nll": rounded(run.nll, 4),
                "time_to_target": rounded(f.time_to_target, 3),
                "wall_time_to_target": rounded(f.wall_time_to_target, 3),
                "samples_to_target": _samples_to_target(frame, run.id, target),
                "speedup": rounded(f.speedup, 3), "ideal": float(workers),
                "efficiency": rounded(f.efficiency, 3), "speedup_note": f.reason if f.speedup is None or
                f.equivalent is False else None,
                "samples_per_s": rounded((run.result or {}).get("samples_per_s"), 1),
                "train_seconds": rounded(run.train_seconds, 2),
                "background_cpu": rounded((run.result or {}).get("background_cpu"), 2),
                "steal_cpu": rounded((run.result or {}).get("steal_cpu"), 2),
            })
    return rows


def _samples_to_target(frame: pd.DataFrame, run_id: str, target: float) -> int | None:
    """Global samples seen when the validation NLL reached ``target``, interpolated as the time to it is (equal
    across an equivalent group)."""
    if frame is None or frame.empty:
        return None
    samples = time_to_target(frame, run_id, target, column="samples")
    return None if samples is None else round(samples)


def study_curves(store: RunStore, study_id: str, *, kind: str = "val", clock: str = "wall") -> pd.DataFrame:
    """Loss curves of a study's runs (``kind`` "val" or "train"): petmodel.analysis.curve_frame.

    ``clock="train"`` puts them on training time (validation pauses left out), the time axis
    of a sweep's speedups.
    """
    from petmodel.analysis import curve_frame

    runs = sorted(store.list_runs(study_id=study_id), key=lambda r: r.created)
    frame = store.metrics_frame([r.id for r in runs])
    return curve_frame(runs, training_clock(frame) if clock == "train" else frame, kind=kind)


def _best_val_so_far(store: RunStore, run_id: str) -> float | None:
    """A running run's best validation NLL so far, from its validation rows only (polled every second)."""
    values = [r["val_nll"] for r in store.metrics(run_id, kind="val") if r.get("val_nll") is not None]
    return float(min(values)) if values else None


def study_progress(store: RunStore, study_id: str) -> list[dict[str, Any]]:
    """The study's points (sweep) or trials (search), each with its run's current status.

    Works for studies driven by any process: the study row's snapshot gives the plan and the
    queued entries, the runs' rows give the live statuses.
    """
    handle = get_study_handle(study_id)
    study = store.get_study(study_id)
    if study is None:
        raise PetmodelError(f"No study called {study_id!r} in the store {store.root}.")
    items = handle.progress() if handle is not None else [dict(i) for i in (study.result or {}).get("items", [])]
    runs = {r.id: r for r in store.list_runs(study_id=study_id)}
    out = []
    for item in items:
        run = runs.get(item.get("run_id") or "")
        if run is not None:
            item["status"] = run.status  # the run's row is the truth; the snapshot may lag
            if run.nll is not None:
                item["val_nll"] = rounded(run.nll, 4)
            elif run.status == RunStatus.RUNNING:  # not finished: its best validation so far, as its curve shows
                item["val_nll"] = rounded(_best_val_so_far(store, run.id), 4)
            item["duration"] = rounded(run.duration, 1)
        elif study.is_finished and item.get("status") in ACTIVE:
            item["status"] = RunStatus.CANCELLED
        out.append(item)
    if study.kind == "search":
        planned = int((study.config or {}).get("trials") or 0)
        for _ in range(len(out), planned):
            out.append({"number": None, "run_id": None, "params": None,
                        "status": RunStatus.CANCELLED if study.is_finished else RunStatus.QUEUED, "val_nll": None})
    return out
