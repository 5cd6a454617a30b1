"""The Experiments page's forecast: every planned row of a sweep before it launches, and beside what it measured.

:func:`forecast_for` calibrates on the cluster the sweep would use (the connected one, else the
embedded one sized as :meth:`~petmodel.app.backend.AppBackend.start_study` sizes it) for a few
seconds; :func:`forecast_frame` is the table shown before the launch, :func:`forecast_vs_measured`
the one shown once runs finished (the sweep keeps its own forecast in its study row).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from petmodel.studies.forecast import speedup_error

if TYPE_CHECKING:
    from petmodel.app.backend import AppBackend
    from petmodel.studies.plan import SweepConfig
    from petmodel.studies.sweep_forecast import SweepForecast

FORECAST_COLUMNS = ["workers", "global_batch", "batch_per_worker", "lr", "step_ms", "step_range_ms",
                    "forecast_speedup", "speedup_range", "time_to_target_s", "basis"]
VERSUS_COLUMNS = ["workers", "global_batch", "lr", "forecast_speedup", "speedup_range", "speedup", "error"]


def forecast_for(be: AppBackend, config: SweepConfig) -> SweepForecast:
    """Calibrate for ``config`` on the cluster it would run on and forecast each planned row."""
    from petmodel.studies.handle import worker_counts
    from petmodel.studies.plan import plan_sweep
    from petmodel.studies.sizing import local_study_cluster
    from petmodel.studies.sweep_forecast import forecast_sweep

    corpus = be.corpus(config.base.data)
    client = be.ensure_study_cluster(local_study_cluster(config))
    plan = plan_sweep(config, None, len(corpus.train_names))  # rows beyond the cluster are forecast, marked so
    return forecast_sweep(client, be.store, config, plan, corpus=corpus, cluster_workers=worker_counts(client)[0])


def _range(low: Any, high: Any, scale: float = 1.0, fmt: str = ".2f") -> str:
    if low is None or high is None:
        return "—"
    return f"{low * scale:{fmt}}–{high * scale:{fmt}}"


def forecast_frame(forecast: SweepForecast | Mapping[str, Any]) -> pd.DataFrame:
    """One row per planned run: forecast step time (ms) and speedup, each with its range, and the time to target."""
    rows = forecast.to_dict()["rows"] if hasattr(forecast, "to_dict") else list(forecast.get("rows", []))
    records = [{"workers": r["workers"], "global_batch": r["global_batch"], "batch_per_worker": r["batch_per_worker"],
                "lr": r["lr"], "step_ms": 1000 * r["step_s"],
                "step_range_ms": _range(r["step_low_s"], r["step_high_s"], 1000, ".1f"),
                "forecast_speedup": r["speedup"], "speedup_range": _range(r["speedup_low"], r["speedup_high"]),
                "time_to_target_s": r["time_to_target_s"], "basis": r["basis"]} for r in rows]
    return pd.DataFrame.from_records(records, columns=FORECAST_COLUMNS)


def forecast_vs_measured(forecast: Mapping[str, Any], measured: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Each measured sweep row beside its forecast: forecast speedup and range, measured speedup, relative error."""
    by_key = {(r["workers"], r["global_batch"], round(float(r["lr"]), 12)): r for r in forecast.get("rows", [])}
    records = []
    for row in measured:
        f = by_key.get((row["workers"], row["global_batch"], round(float(row["lr"]), 12)))
        if f is None:
            continue
        error = speedup_error(f["speedup"], row.get("speedup"))
        records.append({"workers": row["workers"], "global_batch": row["global_batch"], "lr": row["lr"],
                        "forecast_speedup": f["speedup"], "speedup_range": _range(f["speedup_low"], f["speedup_high"]),
                        "speedup": row.get("speedup"), "error": error})
    return pd.DataFrame.from_records(records, columns=VERSUS_COLUMNS)


def forecast_notes(forecast: SweepForecast | Mapping[str, Any]) -> list[str]:
    """What the forecast stands on and could not know, one sentence each."""
    return list(forecast.notes) if hasattr(forecast, "notes") else list(forecast.get("notes", []))
