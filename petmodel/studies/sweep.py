"""The scaling sweep's driver: run a :class:`~petmodel.studies.plan.SweepPlan` one run after another.

Runs go one at a time on an otherwise idle cluster, so no two timings share hardware; each is
metered for CPU the rest of the machine took meanwhile (:mod:`petmodel.studies.meter`), and the
result is the scaling table of :func:`petmodel.studies.results.sweep_table`. Before the first run,
a few seconds of calibration forecast every row's speedup (:mod:`petmodel.studies.sweep_forecast`;
``SweepConfig.forecast``), kept in the study row and set beside each measured row.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from petmodel.analysis import rounded
from petmodel.config import counted
from petmodel.errors import PetmodelError
from petmodel.status import RunStatus
from petmodel.store import RunStore, current_owner
from petmodel.studies.handle import POLL_S, StudyHandle, worker_counts
from petmodel.studies.meter import BACKGROUND_CPU_WARN, BackgroundMeter, local_worker_pids
from petmodel.studies.plan import SweepConfig, SweepPlan, eval_message, plan_sweep, point_spec
from petmodel.studies.repeats import summarise
from petmodel.studies.results import sweep_table

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.data import NameCorpus
    from petmodel.studies.sweep_forecast import SweepForecast


def start_sweep(client: Client, store: RunStore, config: SweepConfig, *,
                corpus: NameCorpus | None = None, forecast: SweepForecast | None = None) -> StudyHandle:
    """Plan ``config`` on ``client``'s cluster, record the study and run it in the background.

    ``forecast``: one already made for this plan (the Experiments page shows it before the launch),
    else the sweep makes its own first when ``config.forecast``. Raises UsageError/PetmodelError
    before anything runs when the grid is impossible.
    """
    from petmodel.data import load_corpus
    from petmodel.tracking import check_tracking

    check_tracking(config.base)
    corpus = corpus or load_corpus(config.base.data)
    total, _ = worker_counts(client)
    plan = plan_sweep(config, total, len(corpus.train_names))
    plan = replace(plan, messages=(*plan.messages, eval_message(config, plan)))
    study_config = {**config.to_dict(), "kind": "sweep", "plan": [asdict(p) for p in plan.points],
                    "messages": list(plan.messages), "warnings": list(plan.warnings), "owner": current_owner()}
    study_id = store.create_study(study_config, kind="sweep", name=config.name, status=RunStatus.RUNNING)
    handle = StudyHandle(study_id, "sweep", store, client)
    handle.messages.extend(plan.messages)
    handle.warnings.extend(plan.warnings)
    handle.items = [{**asdict(p), "label": p.label, "status": RunStatus.QUEUED, "run_id": None, "error": None}
                    for p in plan.points]
    handle.save_progress(equivalent=plan.equivalent, target_nll=config.target_nll)
    handle.run_in_background(lambda: _run_points(handle, client, store, config, plan, corpus, forecast))
    return handle


def run_sweep(client: Client, store: RunStore, config: SweepConfig, *,
              corpus: NameCorpus | None = None) -> dict[str, Any]:
    """:func:`start_sweep` and wait for its result."""
    return start_sweep(client, store, config, corpus=corpus).wait()


def _run_points(handle: StudyHandle, client: Client, store: RunStore, config: SweepConfig, plan: SweepPlan,
                corpus: NameCorpus, forecast: SweepForecast | None = None) -> dict[str, Any]:
    """The sweep's thread: the forecast, each point in turn, then the scaling table."""
    from petmodel.cluster.launch import launch_run

    if forecast is None and config.forecast and not handle.cancelled:
        forecast = _forecast(handle, client, store, config, plan, corpus)
    extra = {"forecast": forecast.to_dict()} if forecast is not None else {}
    if forecast is not None:
        with handle.lock:
            for item, row in zip(handle.items, forecast.rows):
                item["forecast_speedup"] = rounded(row.speedup, 3)

    def save() -> None:
        handle.save_progress(equivalent=plan.equivalent, target_nll=config.target_nll, **extra)

    for item, point in zip(handle.items, plan.points):
        if handle.cancelled:
            break
        # Sequential runs on an otherwise idle cluster: no two timings share hardware.
        if not handle.wait_for_free_workers(point.workers, all_of_cluster=True):
            break
        spec = point_spec(config, point, handle.study_id)
        meter = BackgroundMeter(local_worker_pids(client))
        try:
            run = launch_run(client, spec, store, corpus=corpus, study_id=handle.study_id, kind="sweep")
        except PetmodelError as err:
            with handle.lock:
                item.update(status=RunStatus.FAILED, error=str(err))
            save()
            continue
        handle.track_run(run)
        with handle.lock:
            item.update(status=RunStatus.RUNNING, run_id=run.run_id)
        save()
        while not run.join(POLL_S):
            if handle.cancelled:
                run.cancel(status=RunStatus.CANCELLED, reason="The study was cancelled.")
        background, steal = meter.cores()
        handle.untrack_run(run.run_id)
        with handle.lock:
            item.update(status=run.status, error=run.error, background_cpu=background, steal_cpu=steal)
        if background is not None:
            _add_to_result(store, run.run_id, background_cpu=background, steal_cpu=steal)
        save()
    with handle.lock:
        for item in handle.items:
            if item["status"] == RunStatus.QUEUED:
                item["status"] = RunStatus.CANCELLED
    rows = sweep_table(store, handle.study_id)
    for row in rows:  # every row carries its forecast (None without one), beside what it measured
        row["forecast_speedup"] = (rounded(forecast.speedup_of(row["workers"], row["global_batch"], row["lr"]), 3)
                                   if forecast is not None else None)
    ranges = {(r.workers, r.global_batch, round(r.lr, 12)): (r.speedup, r.speedup_low, r.speedup_high)
              for r in forecast.rows} if forecast is not None else None
    summary = summarise(rows, equivalent=plan.equivalent, forecast=ranges)
    return {**_sweep_result(handle, plan, config, rows), "summary": summary, "repeats": config.repeats, **extra}


def _forecast(handle: StudyHandle, client: Client, store: RunStore, config: SweepConfig, plan: SweepPlan,
              corpus: NameCorpus) -> SweepForecast | None:
    """Calibrate on the idle cluster and forecast the rows; a failed calibration is a note, never the sweep's end."""
    from petmodel.studies.sweep_forecast import forecast_sweep

    try:
        if not handle.wait_for_free_workers(max(p.workers for p in plan.points), all_of_cluster=True):
            return None
        return forecast_sweep(client, store, config, plan, corpus=corpus)
    except PetmodelError as err:
        handle.note(f"No speedup forecast: {err}")
        return None


def _add_to_result(store: RunStore, run_id: str, **fields: Any) -> None:
    run = store.get_run(run_id)
    if run is not None:
        store.update_run(run_id, result={**(run.result or {}), **fields})


def _sweep_result(handle: StudyHandle, plan: SweepPlan, config: SweepConfig,
                  rows: list[dict[str, Any]]) -> dict[str, Any]:
    warnings = list(handle.warnings)
    busy = [r for r in rows if (r.get("background_cpu") or 0) > BACKGROUND_CPU_WARN]
    if busy:
        worst = max(busy, key=lambda r: r["background_cpu"])
        warnings.append(f"Other processes on this machine used up to {worst['background_cpu']:.2f} CPU cores while "
                        f"{len(busy)} of the runs trained (worst: the {worst['workers']}-worker run), which slows runs "
                        "that need every core; rerun when the machine is idle for reliable timings.")
    stolen = [r for r in rows if (r.get("steal_cpu") or 0) > BACKGROUND_CPU_WARN]
    if stolen:
        worst = max(stolen, key=lambda r: r["steal_cpu"])
        warnings.append(f"The hypervisor took up to {worst['steal_cpu']:.2f} CPU cores from this virtual machine while "
                        f"{len(stolen)} of the runs trained (steal time); their timings are not reliable.")
    missed = sorted({counted(r["workers"], "worker") for r in rows
                     if r["status"] == RunStatus.COMPLETED and r["time_to_target"] is None})
    if missed:
        warnings.append(f"Some runs ({', '.join(missed)}) never reached the target NLL {config.target_nll:g} "
                        "within their budget; give them more time or a higher target.")
    return {"study_id": handle.study_id, "kind": "sweep", "status": handle.status, "equivalent": plan.equivalent,
            "target_nll": config.target_nll, "rows": rows, "warnings": warnings, "messages": list(handle.messages),
            "items": handle.progress()}
