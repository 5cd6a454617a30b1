"""``sweep`` and ``search``: the studies from the command line.

Both print a table (or, with ``--json``, one JSON object as the last line) and record the study
in the run store, where the app's Experiments page shows it. Without ``--scheduler`` they start
an embedded local cluster on this machine and stop it at the end.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from petmodel.analysis import run_workers
from petmodel.cli.args import (
    add_run_options,
    remote_from_args,
    csv,
    float_list,
    int_list,
    open_store,
    positive_float,
    positive_int,
    say,
    spec_from_args,
)
from petmodel.config import counted
from petmodel.errors import UsageError
from petmodel.status import RunStatus
from petmodel.studies import (
    DEFAULT_SWEEP_LRS,
    DEFAULT_SWEEP_SECONDS,
    DEFAULT_TARGET_NLL,
    PRUNERS,
    SAMPLERS,
    SEARCH_EVAL_EVERY_S,
    SWEEP_EVAL_EVERY_SAMPLES,
    WRITEUP_BATCHES,
    WRITEUP_LRS,
    WRITEUP_WORKERS,
    SearchConfig,
    SearchSpace,
    StudyHandle,
    SweepConfig,
    start_search,
    start_sweep,
)
from petmodel.studies.builder import search_config, study_base, sweep_config
from petmodel.studies.defaults import DEFAULT_REPEATS, MAX_REPEATS
from petmodel.studies.plan import default_sweep_workers, default_workers_note
from petmodel.studies.sizing import LOCAL_SEARCH_WORKERS, LocalStudyCluster, local_study_cluster

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.store import RunStore


def add_study_commands(sub: Any) -> None:
    """Add the ``sweep`` and ``search`` subcommands to the CLI's subparsers."""
    _add_sweep(sub)
    _add_search(sub)


def _add_sweep(sub: Any) -> None:
    s = sub.add_parser(
        "sweep", help="scaling study: time to a target NLL vs workers",
        description="Run a grid of workers × batch × learning rate one run after another and report, per "
                    "number of workers, the time to reach a target validation NLL, the speedup over one worker "
                    "and the parallel efficiency. By default the global batch stays fixed as the workers vary "
                    "(--equivalent), so the runs differ only in parallel speed.")
    add_run_options(s, default_seconds=DEFAULT_SWEEP_SECONDS)
    s.add_argument("--workers", type=int_list, default=None, metavar="N,N,…",
                   help=f"worker counts (default: powers of two up to the cluster's workers, 1,2,4,8, or the "
                        f"write-up's {csv(WRITEUP_WORKERS)} on a cluster of {max(WRITEUP_WORKERS)} or more; the "
                        f"embedded cluster has as many as this machine's cores hold)")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--equivalent", dest="equivalent", action="store_true", default=True,
                      help="fixed global batch, per-worker batch = global ÷ workers (default)")
    mode.add_argument("--no-equivalent", dest="equivalent", action="store_false",
                      help="fixed batch per worker (the global batch grows with the workers; flagged)")
    s.add_argument("--global-batch", type=int_list, metavar="B,B,…",
                   help=f"global batches in equivalent mode (default: {csv(WRITEUP_BATCHES)}, clipped to the data)")
    s.add_argument("--batch-size", type=int_list, metavar="B,B,…",
                   help=f"batches per worker for a non-equivalent grid (default: {csv(WRITEUP_BATCHES)})")
    s.add_argument("--lr", type=float_list, metavar="LR,LR,…",
                   help=f"learning rates (default {csv(DEFAULT_SWEEP_LRS)}; the write-up used {csv(WRITEUP_LRS)})")
    s.add_argument("--target-nll", type=positive_float, default=DEFAULT_TARGET_NLL,
                   help="validation NLL that counts as reasonable (default %(default)s)")
    s.add_argument("--eval-every-samples", type=positive_int, default=SWEEP_EVAL_EVERY_SAMPLES, metavar="N",
                   help="validate after every N global samples, the same points for every number of workers "
                        "(default %(default)s)")
    s.add_argument("--eval-every", type=positive_float, default=None, metavar="S",
                   help="validate every S seconds instead (points then differ between worker counts)")
    s.add_argument("--repeats", type=positive_int, default=DEFAULT_REPEATS, metavar="K",
                   help="runs of every setting, under distinct seeds and interleaved (1,2,1,2,… workers), for the "
                        "median time to the target and the speedup with its range (default %(default)s, at most "
                        f"{MAX_REPEATS})")
    s.add_argument("--name", help="a label for the study")
    s.add_argument("--forecast-only", action="store_true",
                   help="calibrate on the cluster for a few seconds and print each run's forecast step time, "
                        "speedup and time to the target, without training")
    s.set_defaults(handler=cmd_sweep)


def _add_search(sub: Any) -> None:
    space = SearchSpace()
    q = sub.add_parser(
        "search", help="parallel hyperparameter search with early stopping",
        description="Run many trials at once across the cluster (each on --workers-per-trial workers), sampling "
                    "learning rate, batch, hidden size, layers and dropout; trials that fall behind are stopped "
                    "early (successive halving) so their workers take new trials. The best model is kept and marked "
                    "in the run store. The --max-seconds budget is each trial's full length.")
    add_run_options(q, default_seconds=DEFAULT_SWEEP_SECONDS)
    q.add_argument("--trials", type=positive_int, default=SearchConfig.trials,
                   help="number of trials (default %(default)s)")
    q.add_argument("--workers-per-trial", type=positive_int, default=SearchConfig.workers_per_trial,
                   help="DDP workers per trial (default %(default)s)")
    q.add_argument("--cluster-workers", type=positive_int, default=None,
                   help=f"workers of the embedded local cluster (default {LOCAL_SEARCH_WORKERS}; "
                        "ignored with --scheduler)")
    q.add_argument("--sampler", choices=SAMPLERS, default=SearchConfig.sampler,
                   help="Optuna sampler (default %(default)s)")
    q.add_argument("--pruner", choices=PRUNERS, default=SearchConfig.pruner,
                   help="early stopping: successive halving (sha), hyperband, or none (default %(default)s)")
    q.add_argument("--reduction-factor", type=positive_int, default=SearchConfig.reduction_factor,
                   help="keep the top 1/F of the trials at each rung (default %(default)s)")
    q.add_argument("--first-rung", type=positive_float, default=None, metavar="S",
                   help="seconds of training before the first pruning decision (default: budget ÷ F²)")
    q.add_argument("--eval-every", type=positive_float, default=None, metavar="S",
                   help=f"validate every S seconds (default {SEARCH_EVAL_EVERY_S:g})")
    q.add_argument("--space-lr", type=float_list, metavar="LR,…",
                   help=f"learning rates: a log range (min–max) for random/tpe, choices for grid "
                        f"(default {csv(space.lr)})")
    q.add_argument("--space-batch", type=int_list, metavar="B,…",
                   help=f"batches per worker (default {csv(space.batch_size)})")
    q.add_argument("--space-hidden", type=int_list, metavar="H,…",
                   help=f"LSTM hidden sizes (default {csv(space.hidden)})")
    q.add_argument("--space-layers", type=int_list, metavar="L,…", help=f"LSTM layers (default {csv(space.layers)})")
    q.add_argument("--space-dropout", type=float_list, metavar="D,…",
                   help=f"dropout: a range (min–max) for random/tpe, choices for grid (default {csv(space.dropout)})")
    q.add_argument("--batch-size", type=positive_int, default=SearchConfig.base.train.batch_size,
                   help="batch per worker of the base configuration, tried first (default %(default)s)")
    q.add_argument("--lr", type=positive_float, default=SearchConfig.base.train.lr,
                   help="learning rate of the base configuration (default %(default)s)")
    q.add_argument("--no-baseline", action="store_true", help="do not try the base configuration first")
    q.add_argument("--name", help="a label for the study")
    q.set_defaults(handler=cmd_search)


def cmd_sweep(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.data import load_corpus

    if args.equivalent and args.batch_size:
        raise UsageError("--batch-size (per worker) is for a non-equivalent grid; in equivalent mode give "
                         "--global-batch, or add --no-equivalent.")
    if not args.equivalent and args.global_batch:
        raise UsageError("--global-batch is for the equivalent mode; with --no-equivalent give --batch-size.")
    grid = SweepGrid(args)  # checks every flag now, before the data loads or a cluster starts
    store = open_store(args.store)
    corpus = load_corpus(grid.config.base.data)
    remote = bool(args.scheduler) or args.gateway is not None
    if not remote:  # the embedded cluster gets as many workers as the cores hold: fit the grid to that now
        grid.fit(args, local_study_cluster(None, threads_per_worker=args.threads_per_worker).n_workers)
    local = local_study_cluster(grid.config, threads_per_worker=args.threads_per_worker)
    if not remote and local.note:
        say(args, local.note)
    if args.forecast_only:
        return _forecast_only(args, local, store, grid, corpus, remote_workers=max(grid.config.workers))
    result = _drive(args, local, lambda client: start_sweep(client, store, grid.fit_to(args, client), corpus=corpus),
                    lambda handle: f"Sweep {handle.study_id}: {len(handle.items)} runs, one after another.",
                    remote_workers=max(grid.config.workers))
    out = {"study_id": result["study_id"], "status": result["status"], "equivalent": result["equivalent"],
           "target_nll": result["target_nll"], "rows": result["rows"], "repeats": result["repeats"],
           "summary": result["summary"], "warnings": result["warnings"],
           "messages": result["messages"], "grid_note": grid.note}
    if not args.json:
        _print_sweep(out)
    return out


class SweepGrid:
    """The sweep's config from the flags; without --workers its worker grid waits for the cluster's size.

    The write-up's 1, 4, 16 on a 2-worker cluster would leave only the 1-worker run (nothing to compare),
    so a sweep given no --workers runs :func:`~petmodel.studies.plan.default_sweep_workers` of the workers
    it has: the embedded cluster's are known before it starts, a remote one's once connected.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.lrs = args.lr or list(DEFAULT_SWEEP_LRS)
        self.base = study_base(spec_from_args(args, default_seconds=DEFAULT_SWEEP_SECONDS))
        self.fixed = bool(args.workers)  # --workers given: the plan drops what the cluster cannot hold, saying so
        self.note: str | None = None  # why the grid is what it is, when it was chosen here
        self.config = self._config(args, args.workers or WRITEUP_WORKERS)  # a bad flag fails here, at once

    def _config(self, args: argparse.Namespace, workers: Sequence[int]) -> SweepConfig:
        return sweep_config(self.base, workers=workers, lrs=self.lrs, equivalent=args.equivalent,
                            batches=args.global_batch if args.equivalent else args.batch_size,
                            target_nll=args.target_nll, eval_every_samples=args.eval_every_samples,
                            eval_every_seconds=args.eval_every, name=args.name, repeats=args.repeats)

    def fit(self, args: argparse.Namespace, available: int) -> SweepConfig:
        """The config for a cluster of ``available`` workers: without --workers, its default grid, said on
        stderr once (and kept in ``note`` for the JSON)."""
        if not self.fixed:
            workers = default_sweep_workers(available)
            self.config, self.fixed = self._config(args, workers), True
            self.note = default_workers_note(available, workers)
            say(args, f"note: {self.note} Give --workers N,N,… for other counts.")
        return self.config

    def fit_to(self, args: argparse.Namespace, client: Client) -> SweepConfig:
        """:meth:`fit` to the workers ``client``'s cluster has (asked only when the grid is still open)."""
        if self.fixed:
            return self.config
        from petmodel.studies.handle import worker_counts

        return self.fit(args, worker_counts(client)[0])


def cmd_search(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.data import load_corpus

    space_args = {"lr": args.space_lr, "batch_size": args.space_batch, "hidden": args.space_hidden,
                  "layers": args.space_layers, "dropout": args.space_dropout}
    space = SearchSpace(**{k: tuple(v) for k, v in space_args.items() if v})
    base = study_base(spec_from_args(args, default_seconds=DEFAULT_SWEEP_SECONDS), batch_size=args.batch_size,
                      lr=args.lr)
    config = search_config(base, trials=args.trials, workers_per_trial=args.workers_per_trial, sampler=args.sampler,
                           pruner=args.pruner, space=space, seed=args.seed, min_resource_s=args.first_rung,
                           reduction_factor=args.reduction_factor, include_baseline=not args.no_baseline,
                           name=args.name, eval_every_seconds=args.eval_every)
    store = open_store(args.store)
    corpus = load_corpus(base.data)
    local = local_study_cluster(config, threads_per_worker=args.threads_per_worker,
                                cluster_workers=args.cluster_workers)
    result = _drive(args, local, lambda client: start_search(client, store, config, corpus=corpus),
                    lambda handle: f"Search {handle.study_id}: {config.trials} trials.")
    out = {"study_id": result["study_id"], "status": result["status"],
           "trials": _trials_json(store, result["trials"], config.workers_per_trial), "best": result["best"],
           "pruned": result["pruned"], "full_length": result["full_length"], "failed": result["failed"],
           "concurrency": result["concurrency"], "messages": result["messages"]}
    if not args.json:
        _print_search(out, result.get("leaderboard", []))
    return out


def _trials_json(store: RunStore, trials: list[dict[str, Any]], per_trial: int) -> list[dict[str, Any]]:
    """The search's trials for ``--json``: ``workers`` a count, as in every other result (the driver
    keeps the trial's worker addresses; those are in its run's row under ``runs --json``)."""
    out = []
    for trial in trials:
        run = store.get_run(trial["run_id"]) if trial.get("run_id") else None
        out.append({"number": trial["number"], "run_id": trial["run_id"], "params": trial["params"],
                    "status": trial["status"], "val_nll": trial["val_nll"], "last_step": trial.get("last_step"),
                    "workers": run_workers(run) if run is not None else per_trial, "error": trial.get("error")})
    return out


def _drive(args: argparse.Namespace, local: LocalStudyCluster, start: Callable[[Client], StudyHandle],
           announce: Callable[[StudyHandle], str], remote_workers: int | None = None) -> dict[str, Any]:
    """Start a study on the cluster ``args`` name (else the embedded ``local`` one), watch it, shut down.

    ``remote_workers``: what a --gateway cluster is scaled to (default: the embedded cluster's size).
    """
    from petmodel.cluster.connect import shutdown

    client = remote_from_args(args, remote_workers or local.n_workers) or local.start()
    try:
        handle = start(client)
        for line in handle.messages + handle.warnings:
            say(args, f"note: {line}")
        say(args, announce(handle))
        return _watch(handle, args)
    finally:
        shutdown(client)


def _forecast_only(args: argparse.Namespace, local: LocalStudyCluster, store: RunStore, grid: SweepGrid,
                   corpus: Any, *, remote_workers: int) -> dict[str, Any]:
    """``sweep --forecast-only``: plan on the cluster, calibrate, forecast every row; nothing trains."""
    from petmodel.cluster.connect import shutdown
    from petmodel.studies.handle import worker_counts
    from petmodel.studies.plan import plan_sweep
    from petmodel.studies.sweep_forecast import forecast_sweep, forecast_table

    client = remote_from_args(args, remote_workers) or local.start()
    try:
        config = grid.fit_to(args, client)
        available = worker_counts(client)[0]
        plan = plan_sweep(config, None, len(corpus.train_names))  # more workers than the cluster: forecast beyond it
        forecast = forecast_sweep(client, store, config, plan, corpus=corpus, cluster_workers=available)
    finally:
        shutdown(client)
    out = {"equivalent": plan.equivalent, "target_nll": config.target_nll, "rows": forecast_table(forecast),
           "noise_scale": forecast.noise.to_dict() if forecast.noise is not None else None,
           "calibration_source": forecast.calibration.source,
           "calibration_seconds": round(forecast.calibration.seconds, 2), "notes": list(forecast.notes),
           "warnings": list(plan.warnings), "messages": list(plan.messages), "grid_note": grid.note}
    if not args.json:
        _print_forecast(out)
    return out


def _print_forecast(out: dict[str, Any]) -> None:
    print(f"Forecast ({'equivalent' if out['equivalent'] else 'NOT equivalent'} sweep, nothing trained); "
          f"time to validation NLL ≤ {out['target_nll']:g}:")
    print(f"{'workers':>7} {'global':>7} {'per-wkr':>7} {'lr':>7} {'step ms':>8} {'range ms':>13} "
          f"{'speedup':>7} {'range':>11} {'t→target':>9}  basis")
    for r in out["rows"]:
        rng = f"{r['step_low_s'] * 1e3:.1f}–{r['step_high_s'] * 1e3:.1f}"
        srng = (f"{r['speedup_low']:.2f}–{r['speedup_high']:.2f}" if r["speedup_low"] is not None else "—")
        print(f"{r['workers']:>7} {r['global_batch']:>7} {r['batch_per_worker']:>7} {r['lr']:>7g} "
              f"{r['step_s'] * 1e3:>8.1f} {rng:>13} {_fmt(r['forecast_speedup'], '.2f'):>7} {srng:>11} "
              f"{_fmt(r['time_to_target_s'], '.1f'):>9}  {r['basis']}")
    for line in out["notes"]:
        print(f"note: {line}")
    for w in out["warnings"]:
        print(f"warning: {w}")


def _watch(handle: StudyHandle, args: argparse.Namespace) -> dict[str, Any]:
    """Wait for a study, printing each change of a run's status; Ctrl-C cancels it."""
    seen: dict[Any, str] = {}

    def report() -> None:
        for item in handle.progress():
            key = item.get("index", item.get("number"))
            status = item.get("status")
            if seen.get(key) != status:
                seen[key] = status
                what = item.get("label") or f"trial {item.get('number')} {item.get('params')}"
                done = item.get("val_nll") is not None and status != RunStatus.RUNNING
                extra = f" (val {item['val_nll']})" if done else ""
                say(args, f"  {status:<9} {what}{extra}")

    try:
        while True:
            report()
            if handle.join(0.5):
                break
        report()
        return handle.wait()
    except KeyboardInterrupt:
        handle.cancel()
        handle.join(60)
        raise


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "—"
    return format(value, spec) if spec else str(value)


def _range(low: Any, high: Any) -> str:
    return "—" if low is None or high is None else f"{low:.2f}–{high:.2f}"


def _print_sweep(out: dict[str, Any]) -> None:
    print(f"Sweep {out['study_id']} ({'equivalent' if out['equivalent'] else 'NOT equivalent'}), "
          f"training time to validation NLL ≤ {out['target_nll']:g} (wall: with validation pauses):")
    print(f"{'workers':>7} {'global':>7} {'per-wkr':>7} {'lr':>7} {'status':>9} {'val':>6} {'t→target':>9} "
          f"{'wall':>6} {'speedup':>7} {'effic.':>6} {'bg cpu':>6}  run")
    for r in out["rows"]:
        print(f"{r['workers']:>7} {r['global_batch']:>7} {r['batch_per_worker']:>7} {r['lr']:>7g} {r['status']:>9} "
              f"{_fmt(r['val_nll'], '.3f'):>6} {_fmt(r['time_to_target'], '.2f'):>9} "
              f"{_fmt(r['wall_time_to_target'], '.1f'):>6} {_fmt(r['speedup'], '.2f'):>7} "
              f"{_fmt(r['efficiency'], '.2f'):>6} {_fmt(r.get('background_cpu'), '.2f'):>6}  {r['run_id']}")
    print(f"Per setting ({counted(out['repeats'], 'run')} each; median, low–high):")
    print(f"{'workers':>7} {'global':>7} {'lr':>7} {'t→target':>9} {'range':>13} {'speedup':>7} {'range':>11} "
          f"{'forecast':>8} {'range':>11}")
    for r in out["summary"]:
        print(f"{r['workers']:>7} {r['global_batch']:>7} {r['lr']:>7g} {_fmt(r['time_to_target_median'], '.2f'):>9} "
              f"{_range(r['time_to_target_low'], r['time_to_target_high']):>13} {_fmt(r['speedup_median'], '.2f'):>7} "
              f"{_range(r['speedup_low'], r['speedup_high']):>11} {_fmt(r['forecast_speedup'], '.2f'):>8} "
              f"{_range(r['forecast_low'], r['forecast_high']):>11}")
        if r["spread_note"]:
            print(f"  note: {r['spread_note']}")
    for w in out["warnings"]:
        print(f"warning: {w}")


def _print_search(out: dict[str, Any], board: list[int]) -> None:
    by_number = {t["number"]: t for t in out["trials"]}
    print(f"Search {out['study_id']}: {len(out['trials'])} trials, {out['full_length']} full length, "
          f"{out['pruned']} pruned, {out['failed']} failed.")
    for n in board:
        t = by_number[n]
        p = t["params"] or {}
        print(f"  trial {n:>2} {t['status']:>9} val {_fmt(t['val_nll'], '.3f'):>6}  lr {p.get('lr', 0):.4g} "
              f"batch {p.get('batch_size')} hidden {p.get('hidden')} layers {p.get('layers')} "
              f"dropout {p.get('dropout', 0):.2f}  {t['run_id'] or ''}")
    if out["best"]:
        print(f"Best: run {out['best']['run_id']} with validation NLL {out['best']['val_nll']:.3f}; "
              f"generate with `python -m petmodel generate --model {out['best']['run_id']}`.")
