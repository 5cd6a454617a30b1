"""The forecast of a planned sweep: calibrate on the cluster, read what earlier runs say, forecast each row.

:func:`forecast_sweep` is what ``sweep --forecast-only``, the sweep's own first seconds and the
Experiments page's "Forecast" button call. Earlier runs in the store of the same model and data
give the two things a calibration cannot measure in seconds: the gradient noise scale (from their
DDP windows, :func:`petmodel.step_breakdown.noise_scale`), which a non-equivalent row's speedup
needs, and the steps one run took to the target NLL, which the time to the target needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from petmodel.config import counted, format_list
from petmodel.errors import PetmodelError
from petmodel.step_breakdown import NoiseScale, noise_scale
from petmodel.studies.calibration import CALIBRATION_BUDGET_S, calibrate
from petmodel.studies.forecast import Calibration, RowForecast, forecast_rows
from petmodel.studies.plan import SweepConfig, SweepPlan
from petmodel.studies.target_plan import faster_than_linear

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.config import RunSpec
    from petmodel.data import NameCorpus
    from petmodel.store import RunRecord, RunStore

MODEL_KEYS = ("embed", "hidden", "layers", "dropout", "data", "species")  # what makes two runs the same model
HISTORY_RUNS = 200  # newest runs of the store looked at


@dataclass(frozen=True)
class SweepForecast:
    """Every planned row's forecast, what it stands on, and what it could not know."""

    rows: tuple[RowForecast, ...]
    calibration: Calibration
    noise: NoiseScale | None
    reference_steps: Mapping[float, tuple[int, float]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows], "calibration": self.calibration.to_dict(),
                "noise_scale": self.noise.to_dict() if self.noise is not None else None,
                "reference_steps": {str(lr): list(v) for lr, v in self.reference_steps.items()},
                "notes": list(self.notes)}

    def speedup_of(self, workers: int, global_batch: int, lr: float) -> float | None:
        """The forecast speedup of the row with these settings (what a sweep row is matched by)."""
        for r in self.rows:
            if r.workers == workers and r.global_batch == global_batch and abs(r.lr - lr) < 1e-12:
                return r.speedup
        return None


def plan_pairs(plan: SweepPlan, cluster_workers: int | None = None) -> list[tuple[int, int]]:
    """The (workers, batch per worker) the calibration must measure for ``plan``: a row of more workers than
    ``cluster_workers`` is measured at the cluster's size, its forecast carried from there."""
    top = cluster_workers or max(p.workers for p in plan.points)
    return sorted({(min(p.workers, top), p.batch_per_worker) for p in plan.points})


def beyond_cluster(plan: SweepPlan, cluster_workers: int | None) -> list[int]:
    """The plan's worker counts that the cluster of ``cluster_workers`` cannot host (forecast only)."""
    if cluster_workers is None:
        return []
    return sorted({p.workers for p in plan.points if p.workers > cluster_workers})


def same_model(run: RunRecord, spec: RunSpec) -> bool:
    config, want = run.config or {}, spec.to_dict()
    return all(config.get(k) == want.get(k) for k in MODEL_KEYS) and \
        (config.get("train") or {}).get("precision") == spec.train.precision


def history(store: RunStore, spec: RunSpec, target_nll: float) -> tuple[NoiseScale | None, dict[float, tuple[int, float]]]:
    """(the noise scale of earlier DDP runs of ``spec``'s model, lr → (global batch, steps) to ``target_nll``)."""
    from petmodel.status import RunStatus

    runs = [r for r in store.list_runs(limit=HISTORY_RUNS) if r.status == RunStatus.COMPLETED and same_model(r, spec)]
    if not runs:
        return None, {}
    windows = store.step_time_rows([r.id for r in runs])
    noise = noise_scale([row for r in runs for row in windows.get(r.id, [])])
    steps: dict[float, tuple[int, float]] = {}
    for run in runs:  # newest first: the first found for a learning rate wins
        train = (run.config or {}).get("train") or {}
        lr, batch = float(train.get("lr") or 0.0), int((run.result or {}).get("global_batch")
                                                       or (run.config or {}).get("global_batch") or 0)
        if lr in steps or batch <= 0:
            continue
        hit = next((m for m in store.metrics(run.id, kind="val")
                    if m.get("val_nll") is not None and m["val_nll"] <= target_nll), None)
        if hit is not None and hit.get("samples"):
            steps[lr] = (batch, float(hit["samples"]) / batch)
    return noise, steps


def forecast_sweep(client: Client, store: RunStore, config: SweepConfig, plan: SweepPlan, *,
                   corpus: NameCorpus, budget_s: float = CALIBRATION_BUDGET_S,
                   cluster_workers: int | None = None) -> SweepForecast:
    """Calibrate for ``plan`` on ``client``'s cluster and forecast each of its rows; rows of more workers than
    ``cluster_workers`` are forecast beyond it. A calibration that makes N workers more than N times as fast
    as one (:func:`faster_than_linear`) is measured once more before the rows are forecast from it."""
    beyond = beyond_cluster(plan, cluster_workers)
    if beyond and (cluster_workers or 0) < 2:
        raise PetmodelError(f"Forecasting {format_list(beyond)} workers needs a cluster of at least 2 workers to "
                            "measure the all-reduce on; start or connect more workers.")
    pairs = plan_pairs(plan, cluster_workers)
    calibration = calibrate(client, config.base, pairs, corpus=corpus, budget_s=budget_s)
    if _impossible(calibration, plan):
        calibration = calibrate(client, config.base, pairs, corpus=corpus, budget_s=budget_s)
    return forecast_from(calibration, store, config, plan)


def _impossible(calibration: Calibration, plan: SweepPlan) -> list[tuple[int, int, float]]:
    """Where the calibration makes N workers step more than N times as fast as one, at a global batch of the
    plan's (equivalent rows only: elsewhere the batch per worker, not the global batch, is shared)."""
    if not plan.equivalent:
        return []
    return faster_than_linear(calibration, sorted({p.workers for p in plan.points}),
                              sorted({p.global_batch for p in plan.points}))


def forecast_from(calibration: Calibration, store: RunStore | None, config: SweepConfig,
                  plan: SweepPlan) -> SweepForecast:
    """:func:`forecast_sweep` once the calibration is done (or given): the history, then the rows."""
    noise, steps = history(store, config.base, config.target_nll) if store is not None else (None, {})
    rows = forecast_rows(plan.points, calibration, equivalent=plan.equivalent, noise=noise, reference_steps=steps)
    notes = [f"Calibration {calibration.source}, {calibration.seconds:.1f} s."]
    impossible = {(n, b): ratio for n, b, ratio in _impossible(calibration, plan)}
    if impossible:  # never shown as a result: the row keeps its step time, not the speedup
        rows = [replace(r, speedup=None, speedup_low=None, speedup_high=None,
                        basis=f"calibration error: {r.workers} workers stepped {impossible[(r.workers, r.global_batch)]:.2f}× "
                              "as fast as 1, more than linear")
                if (r.workers, r.global_batch) in impossible else r for r in rows]
        notes.append("Measured twice, the calibration made more workers faster than linear at "
                     f"{format_list(sorted({b for _, b in impossible}))} global batch; those speedups are left out.")
    beyond = sorted({r.workers for r in rows if r.workers > calibration.measured_workers})
    if beyond:
        notes.append(f"{format_list(beyond)} workers are beyond the cluster: forecast from the calibration on "
                     f"{counted(calibration.measured_workers, 'worker')} (compute per rank as measured, the all-reduce "
                     "from the ring model, the wait for the slowest rank grown with their number), with a wider range.")
    if not plan.equivalent:
        notes.append(f"Steps to the target at each global batch from the gradient noise scale B_noise = "
                     f"{noise.b_noise:,.0f} ± {noise.error:,.0f} names ({noise.windows} windows of earlier DDP runs)."
                     if noise is not None else
                     "No earlier DDP run of this model measured its gradient noise scale, so the speedups of rows "
                     "that change the global batch are unknown; run one multi-worker run first.")
    if not any(r.time_to_target_s is not None for r in rows):
        notes.append("No earlier run of this model reached the target NLL at these learning rates, so the time to "
                     "the target is unknown; the speedups do not need it.")
    return SweepForecast(tuple(rows), calibration, noise, steps, tuple(notes))


def forecast_table(forecast: SweepForecast | Mapping[str, Any]) -> list[dict[str, Any]]:
    """One plain row per planned run (workers, batches, forecast step and speedup with its range, time to
    target): what the CLI prints and the Experiments page shows."""
    rows: Sequence[Mapping[str, Any]] = (forecast.to_dict()["rows"] if isinstance(forecast, SweepForecast)
                                         else forecast.get("rows", []))
    out = []
    for r in rows:
        out.append({"workers": r["workers"], "global_batch": r["global_batch"],
                    "batch_per_worker": r["batch_per_worker"], "lr": r["lr"], "step_s": r["step_s"],
                    "step_low_s": r["step_low_s"], "step_high_s": r["step_high_s"],
                    "forecast_speedup": r["speedup"], "speedup_low": r["speedup_low"],
                    "speedup_high": r["speedup_high"], "steps_ratio": r["steps_ratio"],
                    "time_to_target_s": r["time_to_target_s"], "basis": r["basis"],
                    "beyond_cluster": bool(r.get("beyond_cluster", False)),
                    **{k: v for k, v in r["parts"].items()}})
    return out
