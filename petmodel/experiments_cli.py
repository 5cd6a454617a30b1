"""``python -m petmodel sweep`` and ``python -m petmodel search``: the studies from the command line.

Both print a table (or, with ``--json``, one JSON object as the last line) and record the study
in the run store, where the app's Experiments page shows it. Without ``--scheduler`` they start
an embedded local cluster on this machine and stop it at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from petmodel.cli import _positive_float, _positive_int  # one definition of the CLI's number checks
from petmodel.errors import UsageError


def _list_type(kind: type) -> Callable[[str], list]:
    """An argparse ``type=`` for comma-separated numbers, through the one parser the app uses too."""
    from petmodel.experiments import parse_list

    def parse(text: str) -> list:
        try:
            return parse_list(text, "The values", kind)
        except UsageError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = f"{kind.__name__} list"  # argparse names the type in its own messages
    return parse


_int_list = _list_type(int)
_float_list = _list_type(float)


def add_study_commands(sub: Any, add_run_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the ``sweep`` and ``search`` subcommands to the CLI's subparsers."""
    from petmodel.experiments import DEFAULT_SWEEP_LRS, DEFAULT_TARGET_NLL, SWEEP_EVAL_EVERY_SAMPLES, WRITEUP_LRS

    s = sub.add_parser(
        "sweep", help="scaling study: time to a target NLL vs workers",
        description="Run a grid of workers × batch × learning rate one run after another and report, per "
                    "number of workers, the time to reach a target validation NLL, the speedup over one worker "
                    "and the parallel efficiency. By default the global batch stays fixed as the workers vary "
                    "(--equivalent), so the runs differ only in parallel speed.")
    add_run_options(s)
    s.add_argument("--workers", type=_int_list, default=None, metavar="N,N,…",
                   help="worker counts (default: the write-up's 1,4,16, clipped to the cluster)")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--equivalent", dest="equivalent", action="store_true", default=True,
                      help="fixed global batch, per-worker batch = global ÷ workers (default)")
    mode.add_argument("--no-equivalent", dest="equivalent", action="store_false",
                      help="fixed batch per worker (the global batch grows with the workers; flagged)")
    s.add_argument("--global-batch", type=_int_list, metavar="B,B,…",
                   help="global batches in equivalent mode (default: 1024,4096,16384, clipped to the data)")
    s.add_argument("--batch-size", type=_int_list, metavar="B,B,…",
                   help="batches per worker for a non-equivalent grid (default: 1024,4096,16384)")
    s.add_argument("--lr", type=_float_list, metavar="LR,LR,…",
                   help=f"learning rates (default {','.join(f'{v:g}' for v in DEFAULT_SWEEP_LRS)}; the write-up "
                        f"used {','.join(f'{v:g}' for v in WRITEUP_LRS)})")
    s.add_argument("--target-nll", type=_positive_float, default=DEFAULT_TARGET_NLL,
                   help=f"validation NLL that counts as reasonable (default {DEFAULT_TARGET_NLL:g})")
    s.add_argument("--eval-every-samples", type=_positive_int, default=SWEEP_EVAL_EVERY_SAMPLES, metavar="N",
                   help=f"validate after every N global samples, the same points for every number of workers "
                        f"(default {SWEEP_EVAL_EVERY_SAMPLES})")
    s.add_argument("--eval-every", type=_positive_float, default=None, metavar="S",
                   help="validate every S seconds instead (points then differ between worker counts)")
    s.add_argument("--name", help="a label for the study")

    q = sub.add_parser(
        "search", help="parallel hyperparameter search with early stopping",
        description="Run many trials at once across the cluster (each on --workers-per-trial workers), sampling "
                    "learning rate, batch, hidden size, layers and dropout; trials that fall behind are stopped "
                    "early (successive halving) so their workers take new trials. The best model is kept and marked "
                    "in the run store. The --max-seconds budget is each trial's full length.")
    add_run_options(q)
    q.add_argument("--trials", type=_positive_int, default=8, help="number of trials (default 8)")
    q.add_argument("--workers-per-trial", type=_positive_int, default=1, help="DDP workers per trial (default 1)")
    q.add_argument("--cluster-workers", type=_positive_int, default=None,
                   help="workers of the embedded local cluster (default 2; ignored with --scheduler)")
    q.add_argument("--sampler", choices=["random", "tpe", "grid"], default="tpe", help="Optuna sampler (default tpe)")
    q.add_argument("--pruner", choices=["sha", "hyperband", "none"], default="sha",
                   help="early stopping: successive halving (default), hyperband, or none")
    q.add_argument("--reduction-factor", type=_positive_int, default=3,
                   help="keep the top 1/F of the trials at each rung (default 3)")
    q.add_argument("--first-rung", type=_positive_float, default=None, metavar="S",
                   help="seconds of training before the first pruning decision (default: budget ÷ F²)")
    q.add_argument("--eval-every", type=_positive_float, default=None, metavar="S",
                   help="validate every S seconds (default 3)")
    q.add_argument("--space-lr", type=_float_list, metavar="LR,…",
                   help="learning rates: a log range (min–max) for random/tpe, choices for grid "
                        "(default 0.003,0.006,0.012,0.024)")
    q.add_argument("--space-batch", type=_int_list, metavar="B,…", help="batches per worker (default 64,128,256)")
    q.add_argument("--space-hidden", type=_int_list, metavar="H,…", help="LSTM hidden sizes (default 128,256)")
    q.add_argument("--space-layers", type=_int_list, metavar="L,…", help="LSTM layers (default 1,2)")
    q.add_argument("--space-dropout", type=_float_list, metavar="D,…",
                   help="dropout: a range (min–max) for random/tpe, choices for grid (default 0,0.15,0.3)")
    q.add_argument("--batch-size", type=_positive_int, default=128,
                   help="batch per worker of the base configuration, tried first (default 128)")
    q.add_argument("--lr", type=_positive_float, default=0.005, help="learning rate of the base configuration (default 0.005)")
    q.add_argument("--no-baseline", action="store_true", help="do not try the base configuration first")
    q.add_argument("--name", help="a label for the study")


def _client_for(args: argparse.Namespace, n_workers: int):
    """The cluster to run on: --scheduler's, or an embedded local one set up for timing (quiet workers)."""
    import dask

    from petmodel.dist.cluster import connect, start_local_cluster
    from petmodel.dist.tuning import TIMING_CLUSTER_CONFIG

    if args.scheduler:
        return connect(args.scheduler)
    with dask.config.set(TIMING_CLUSTER_CONFIG):
        return start_local_cluster(n_workers, args.threads_per_worker)


def _local_cap(threads_per_worker: int) -> int:
    """Workers an embedded cluster may have here: one per group of threads_per_worker cores."""
    return max(1, (os.cpu_count() or 1) // max(1, threads_per_worker))


def _default_budget(args: argparse.Namespace) -> None:
    """Each run of a study trains for DEFAULT_SWEEP_SECONDS unless --epochs or --max-seconds says otherwise."""
    from petmodel.experiments import DEFAULT_SWEEP_SECONDS

    if args.epochs is None and args.max_seconds is None:
        args.max_seconds = DEFAULT_SWEEP_SECONDS


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(text, file=sys.stderr)


def _drive(args: argparse.Namespace, n_local: int, start: Callable[[Any], Any],
           announce: Callable[[Any], str]) -> dict[str, Any]:
    """Start a study on the cluster ``args`` name (or a local one of ``n_local`` workers), watch it, shut down."""
    from petmodel.dist.cluster import shutdown

    client = _client_for(args, n_local)
    try:
        handle = start(client)
        for line in handle.messages + handle.warnings:
            _say(args, f"note: {line}")
        _say(args, announce(handle))
        return _watch(handle, args)
    finally:
        shutdown(client)


def _watch(handle: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Wait for a study, printing each change of a run's status; Ctrl-C cancels it."""
    import time

    seen: dict[Any, str] = {}

    def report() -> None:
        for item in handle.progress():
            key = item.get("index", item.get("number"))
            status = item.get("status")
            if seen.get(key) != status:
                seen[key] = status
                what = item.get("label") or f"trial {item.get('number')} {item.get('params')}"
                extra = f" (val {item['val_nll']})" if item.get("val_nll") is not None and status != "running" else ""
                _say(args, f"  {status:<9} {what}{extra}")

    try:
        while not handle.done():
            report()
            time.sleep(0.5)
        report()
        return handle.wait()
    except KeyboardInterrupt:
        handle.cancel()
        try:
            handle.wait(timeout=60)
        except Exception:  # noqa: BLE001 - we are leaving anyway
            pass
        raise


def cmd_sweep(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.cli import open_store, spec_from_args
    from petmodel.data import load_corpus
    from petmodel.experiments import DEFAULT_SWEEP_LRS, WRITEUP_WORKERS, SweepConfig, start_sweep

    if args.equivalent and args.batch_size:
        raise UsageError("--batch-size (per worker) is for a non-equivalent grid; in equivalent mode give "
                         "--global-batch, or add --no-equivalent.")
    if not args.equivalent and args.global_batch:
        raise UsageError("--global-batch is for the equivalent mode; with --no-equivalent give --batch-size.")
    workers = args.workers or list(WRITEUP_WORKERS)
    lrs = args.lr or list(DEFAULT_SWEEP_LRS)
    _default_budget(args)
    base = spec_from_args(args, batch_size=128, lr=lrs[0], workers=0)
    config = SweepConfig(base=base, workers=workers, global_batches=args.global_batch,
                         batch_per_worker=args.batch_size, lrs=lrs, target_nll=args.target_nll,
                         equivalent=args.equivalent, eval_every_samples=args.eval_every_samples,
                         eval_every_seconds=args.eval_every, name=args.name)
    store = open_store(args.store)
    corpus = load_corpus(base.data, progress=not args.json)
    n_local = min(max(config.workers), _local_cap(args.threads_per_worker))
    if not args.scheduler and n_local < max(config.workers):
        _say(args, f"This machine has {os.cpu_count()} CPU cores, so the local cluster gets {n_local} workers.")
    result = _drive(args, n_local, lambda client: start_sweep(client, store, config, corpus=corpus),
                    lambda handle: f"Sweep {handle.study_id}: {len(handle.items)} runs, one after another.")
    out = {"study_id": result["study_id"], "status": result["status"], "equivalent": result["equivalent"],
           "target_nll": result["target_nll"], "rows": result["rows"], "warnings": result["warnings"],
           "messages": result["messages"]}
    if not args.json:
        _print_sweep(out)
    return out


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "—"
    return format(value, spec) if spec else str(value)


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
    for w in out["warnings"]:
        print(f"warning: {w}")


def cmd_search(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.cli import open_store, spec_from_args
    from petmodel.data import load_corpus
    from petmodel.experiments import SearchConfig, SearchSpace, start_search

    space_args = {"lr": args.space_lr, "batch_size": args.space_batch, "hidden": args.space_hidden,
                  "layers": args.space_layers, "dropout": args.space_dropout}
    space = SearchSpace(**{k: tuple(v) for k, v in space_args.items() if v})
    _default_budget(args)
    base = spec_from_args(args, batch_size=args.batch_size, lr=args.lr, workers=0)
    kwargs: dict[str, Any] = {}
    if args.eval_every is not None:
        kwargs["eval_every_seconds"] = args.eval_every
    config = SearchConfig(base=base, trials=args.trials, workers_per_trial=args.workers_per_trial,
                          sampler=args.sampler, pruner=args.pruner, space=space, seed=args.seed,
                          min_resource_s=args.first_rung, reduction_factor=args.reduction_factor,
                          include_baseline=not args.no_baseline, name=args.name, **kwargs)
    store = open_store(args.store)
    corpus = load_corpus(base.data, progress=not args.json)
    n_local = args.cluster_workers or max(2, args.workers_per_trial)
    result = _drive(args, n_local, lambda client: start_search(client, store, config, corpus=corpus),
                    lambda handle: f"Search {handle.study_id}: {config.trials} trials.")
    out = {"study_id": result["study_id"], "status": result["status"], "trials": result["trials"],
           "best": result["best"], "pruned": result["pruned"], "full_length": result["full_length"],
           "failed": result["failed"], "concurrency": result["concurrency"], "messages": result["messages"]}
    if not args.json:
        _print_search(out, result.get("leaderboard", []))
    return out


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


STUDY_COMMANDS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "sweep": cmd_sweep, "search": cmd_search}
