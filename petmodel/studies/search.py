"""The parallel hyperparameter search's driver: many DDP trials at once, Optuna deciding what to try and prune.

Each trial runs on ``workers_per_trial`` free workers, at most ``workers ÷ workers_per_trial`` at a
time. A client-side loop reads each trial's validation NLL from the store as it lands, reports it
to Optuna with the elapsed seconds as the step, and cancels a trial Optuna prunes (its run ends
``pruned``), so its workers take the next trial. A failing trial is told to Optuna as failed and
the others go on. The best completed trial's model is kept and marked (``best_of_study`` in its
run result, "★ best" in its name, ``best_run_id`` in the study result).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from petmodel.analysis import rounded
from petmodel.errors import PetmodelError, UsageError
from petmodel.status import RunStatus
from petmodel.store import RunStore, current_owner
from petmodel.studies.handle import POLL_S, StudyHandle, worker_counts
from petmodel.studies.search_config import SearchConfig, make_optuna_study

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.data import NameCorpus
    from petmodel.cluster.launch import RunHandle

_LEADERBOARD_ORDER = {RunStatus.COMPLETED: 0, RunStatus.PRUNED: 1, RunStatus.RUNNING: 2, RunStatus.CANCELLED: 3,
                      RunStatus.FAILED: 4, RunStatus.QUEUED: 5}


def start_search(client: Client, store: RunStore, config: SearchConfig, *,
                 corpus: NameCorpus | None = None) -> StudyHandle:
    """Record the study and run the search in the background; returns its handle at once."""
    from petmodel.data import load_corpus
    from petmodel.tracking import check_tracking

    check_tracking(config.base)
    corpus = corpus or load_corpus(config.base.data)
    total, _ = worker_counts(client)
    k = config.workers_per_trial
    if total < k:
        raise UsageError(f"Each trial needs {k} workers but the cluster has {total}; "
                         "ask for fewer workers per trial or start more.")
    concurrency = total // k
    messages: list[str] = []
    if config.max_concurrent is not None and config.max_concurrent < concurrency:
        concurrency = config.max_concurrent
    trials = config.trials
    if config.sampler == "grid" and trials > config.space.grid_size:
        messages.append(f"The grid has {config.space.grid_size} configurations, so the search runs "
                        f"{config.space.grid_size} trials, not {trials}.")
        trials = config.space.grid_size
    biggest = max(config.space.batch_size) * k
    if biggest > len(corpus.train_names):
        messages.append(f"Trials with a global batch above the {len(corpus.train_names):,} training names will fail; "
                        "use smaller batches.")
    optuna_study, notes = make_optuna_study(config)
    messages.extend(notes)
    messages.append(f"Up to {concurrency} trial{'s' if concurrency != 1 else ''} at a time "
                    f"({total} workers ÷ {k} per trial).")
    study_config = {**config.to_dict(), "kind": "search", "trials": trials, "concurrency": concurrency,
                    "owner": current_owner()}
    study_id = store.create_study(study_config, kind="search", name=config.name, status=RunStatus.RUNNING)
    handle = StudyHandle(study_id, "search", store, client)
    handle.messages.extend(messages)
    driver = _SearchDriver(handle, client, store, config, corpus, optuna_study, trials, concurrency)
    driver.save(force=True)
    handle.run_in_background(driver.run)
    return handle


def run_search(client: Client, store: RunStore, config: SearchConfig, *,
               corpus: NameCorpus | None = None) -> dict[str, Any]:
    """:func:`start_search` and wait for its result."""
    return start_search(client, store, config, corpus=corpus).wait()


def search_leaderboard(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Trials best first: completed by validation NLL, then pruned, then the rest."""
    def key(item: Mapping[str, Any]) -> tuple:
        val = item.get("val_nll")
        return (_LEADERBOARD_ORDER.get(str(item.get("status")), 6), val if val is not None else math.inf,
                item.get("number", 0))

    return [dict(item) for item in sorted(items, key=key)]


@dataclass
class _Trial:
    """One Optuna trial and its run, with what has been reported of it so far."""

    trial: Any
    item: dict[str, Any]
    run: RunHandle | None = None
    last_id: int = 0  # last metric row read
    last_step: int = -1  # last step (elapsed seconds) reported to Optuna
    pruning: bool = False


class _SearchDriver:
    """The search's thread: launch trials while workers are free, report, prune, collect; then the result."""

    def __init__(self, handle: StudyHandle, client: Client, store: RunStore, config: SearchConfig,
                 corpus: NameCorpus, optuna_study: Any, n_trials: int, concurrency: int) -> None:
        self.handle, self.client, self.store, self.config = handle, client, store, config
        self.corpus, self.optuna_study = corpus, optuna_study
        self.n_trials, self.concurrency = n_trials, concurrency
        self.running: list[_Trial] = []
        self.launched = 0
        self._last_save = 0.0

    def save(self, force: bool = False) -> None:
        if force or time.monotonic() - self._last_save > 2.0:
            self._last_save = time.monotonic()
            self.handle.save_progress(trials=self.n_trials, concurrency=self.concurrency)

    def run(self) -> dict[str, Any]:
        handle = self.handle
        while True:
            self._launch_while_free()
            if not self.running and (self.launched >= self.n_trials or handle.cancelled):
                break
            for t in list(self.running):
                self._report(t)
            if handle.cancelled:
                for t in self.running:
                    if t.run is not None and not t.run.done():
                        t.run.cancel(status=RunStatus.CANCELLED, reason="The study was cancelled.")
            self.save()
            time.sleep(POLL_S)
        return self._result()

    def _launch_while_free(self) -> None:
        """Start trials while there are slots, trials left and free workers."""
        from petmodel.cluster.launch import launch_run

        handle, config, k = self.handle, self.config, self.config.workers_per_trial
        while (not handle.cancelled and self.launched < self.n_trials and len(self.running) < self.concurrency
               and worker_counts(self.client)[1] >= k):
            trial = self.optuna_study.ask()
            params = config.space.suggest(trial, config.sampler)
            self.launched += 1
            item = {"number": trial.number, "run_id": None, "params": params, "status": RunStatus.RUNNING,
                    "val_nll": None,
                    "last_step": None, "error": None, "workers": [], "started": time.time(), "finished": None,
                    "full_length": False}
            with handle.lock:
                handle.items.append(item)
            t = _Trial(trial, item)
            changes = dict(params, workers=k, name=f"search {handle.study_id} · trial {trial.number}")
            if config.eval_every_seconds is not None:
                changes["eval_every_seconds"] = float(config.eval_every_seconds)
            try:
                spec = config.base.with_(**changes)
                run = launch_run(self.client, spec, self.store, corpus=self.corpus, study_id=handle.study_id,
                                 kind="search")
            except PetmodelError as err:
                self._finish(t, RunStatus.FAILED, str(err))
                self.save(force=True)
                continue
            t.run = run
            handle.track_run(run)
            with handle.lock:
                item.update(run_id=run.run_id, workers=run.worker_addresses)
            self.running.append(t)
            self.save(force=True)

    def _report(self, t: _Trial) -> None:
        """Tell Optuna the trial's new validation points, prune it if Optuna says so, collect it when it ends."""
        assert t.run is not None
        rows = self.store.metrics(t.run.run_id, since_id=t.last_id, kind="val")
        for row in rows:
            t.last_id = max(t.last_id, int(row["id"]))
            if row.get("val_nll") is None or row.get("elapsed") is None:
                continue
            step = int(row["elapsed"])
            with self.handle.lock:
                t.item["val_nll"] = rounded(row["val_nll"], 4)
                t.item["last_step"] = step
            if step > t.last_step and math.isfinite(float(row["val_nll"])):
                t.trial.report(float(row["val_nll"]), step=step)
                t.last_step = step
        if rows and not t.pruning and not t.run.done() and t.last_step >= 0 and t.trial.should_prune():
            t.pruning = True
            pruner = "successive halving" if self.config.pruner == "sha" else self.config.pruner
            t.run.cancel(status=RunStatus.PRUNED, reason=f"Pruned by {pruner} after {t.last_step} s "
                                                 f"(validation NLL {t.item['val_nll']}).")
            with self.handle.lock:
                t.item["pruning"] = True
        if t.run.done():
            self.running.remove(t)
            self._finish(t, t.run.status, t.run.error)
            self.save(force=True)

    def _finish(self, t: _Trial, status: str, error: str | None = None) -> None:
        """Tell Optuna how the trial ended and record it in the study's items."""
        from optuna.trial import TrialState

        run = self.store.get_run(t.item["run_id"]) if t.item.get("run_id") else None
        val = run.nll if run is not None else None
        if status == RunStatus.COMPLETED and val is not None and math.isfinite(val):
            self.optuna_study.tell(t.trial, float(val))
        elif status == RunStatus.PRUNED:
            self.optuna_study.tell(t.trial, state=TrialState.PRUNED)
        else:
            self.optuna_study.tell(t.trial, state=TrialState.FAIL)
            if status == RunStatus.COMPLETED:
                status, error = RunStatus.FAILED, error or "The run ended without a validation NLL."
        with self.handle.lock:
            if val is None:
                val = t.item.get("val_nll")
            t.item.update(status=status, error=error, val_nll=rounded(val, 4),
                          finished=time.time(), full_length=status == RunStatus.COMPLETED)
        if t.run is not None:
            self.handle.untrack_run(t.run.run_id)

    def _result(self) -> dict[str, Any]:
        handle, config = self.handle, self.config
        items = handle.progress()
        board = search_leaderboard(items)
        best_item = next((i for i in board if i["status"] == RunStatus.COMPLETED and i.get("val_nll") is not None),
                         None)
        best = None
        if best_item is not None:
            best = {"run_id": best_item["run_id"], "val_nll": best_item["val_nll"], "params": best_item["params"],
                    "number": best_item["number"]}
            _mark_best(self.store, best_item["run_id"], handle.study_id)
        counts = {s: sum(1 for i in items if i["status"] == s) for s in RunStatus}
        trials = [{"number": i["number"], "run_id": i["run_id"], "params": i["params"], "status": i["status"],
                   "val_nll": i["val_nll"], "last_step": i.get("last_step"), "workers": i.get("workers"),
                   "error": i.get("error")} for i in items]
        return {"study_id": handle.study_id, "kind": "search", "status": handle.status, "trials": trials,
                "leaderboard": [t["number"] for t in board], "best": best,
                "best_run_id": best["run_id"] if best else None, "pruned": counts[RunStatus.PRUNED],
                "full_length": counts[RunStatus.COMPLETED], "failed": counts[RunStatus.FAILED],
                "cancelled": counts[RunStatus.CANCELLED],
                "requested_trials": self.n_trials, "concurrency": self.concurrency, "sampler": config.sampler,
                "pruner": config.pruner, "first_rung_s": config.first_rung_s(), "messages": list(handle.messages),
                "warnings": list(handle.warnings), "items": items}


def _mark_best(store: RunStore, run_id: str, study_id: str) -> None:
    """Mark the study's best run: ``best_of_study`` in its result, "★ best" in its name."""
    run = store.get_run(run_id)
    if run is None:
        return
    name = run.name or run.id
    if "★ best" not in name:
        name = f"{name} ★ best"
    store.update_run(run_id, result={**(run.result or {}), "best_of_study": study_id}, name=name)
