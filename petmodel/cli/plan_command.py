"""``python -m petmodel plan --target-nll X``: which workers, global batch and learning rate reach X soonest.

Measures before it answers (:mod:`petmodel.studies.planning`: two short probes, or the store's earlier runs,
and the sweep's calibration of every candidate's step time on the cluster) and prints every candidate with
its forecast time to the target on the training clock, the recommendation first, why, and the ``train``
command that runs it. Nothing it trains is kept. Without ``--scheduler`` it starts the embedded local
cluster (as many workers as this machine's cores hold, or ``--max-workers``).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from petmodel.cli.args import add_run_options, open_store, positive_float, positive_int, remote_from_args, say
from petmodel.config import DEFAULT_SPEC
from petmodel.studies.defaults import DEFAULT_TARGET_NLL, SWEEP_EVAL_EVERY_SAMPLES


def add_plan_command(sub: Any) -> None:
    from petmodel.studies.calibration import CALIBRATION_BUDGET_S
    from petmodel.studies.probe import PROBE_BUDGET_S
    from petmodel.studies.target_plan import LrRule

    rule = LrRule()
    p = sub.add_parser(
        "plan", help="before training: which workers, batch and learning rate reach a target NLL soonest",
        description="Forecast, for every candidate setting (1 and powers of two up to the cluster's workers × "
                    "global batches the data fills, learning rate by the square-root rule), the training-clock "
                    "time to reach a target validation NLL on this cluster, and recommend the fastest. It measures "
                    "first: two short probe runs to the target (or earlier runs in the store that followed the "
                    "rule) and a calibration of every candidate's step time on the cluster; seconds, not a sweep.")
    add_run_options(p, default_seconds=None, trains=False)
    p.add_argument("--target-nll", type=positive_float, default=DEFAULT_TARGET_NLL,
                   help="validation NLL to reach (default %(default)s)")
    p.add_argument("--max-workers", type=positive_int, default=None, metavar="N",
                   help="plan for at most N workers (default: every worker of the cluster)")
    p.add_argument("--lr", type=positive_float, default=rule.base_lr,
                   help=f"learning rate at global batch {rule.base_batch}; other batches by √(batch ÷ "
                        f"{rule.base_batch}) (default %(default)s)")
    p.add_argument("--probe-seconds", type=positive_float, default=PROBE_BUDGET_S, metavar="S",
                   help="most training seconds for each probe (default %(default)g)")
    p.add_argument("--calibration-seconds", type=positive_float, default=CALIBRATION_BUDGET_S, metavar="S",
                   help="seconds of timed steps for the calibration, shared by the candidates (default %(default)g)")
    p.add_argument("--fresh", action="store_true", help="probe even when earlier runs in the store would do")
    p.add_argument("--eval-every-samples", type=positive_int, default=SWEEP_EVAL_EVERY_SAMPLES, metavar="N",
                   help="the runs validate every N global samples, as a sweep's (default %(default)s)")
    p.set_defaults(handler=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.cli.args import spec_from_args
    from petmodel.cluster.connect import shutdown
    from petmodel.data import load_corpus
    from petmodel.studies.planning import plan_for_target
    from petmodel.studies.sizing import LocalStudyCluster, local_study_cluster
    from petmodel.studies.target_plan import LrRule

    spec = spec_from_args(args, default_seconds=60.0)
    rule = LrRule(base_lr=args.lr)
    store = open_store(args.store)
    corpus = load_corpus(spec.data)
    local = local_study_cluster(None, threads_per_worker=args.threads_per_worker)
    if args.max_workers:
        local = LocalStudyCluster(min(local.n_workers, args.max_workers), local.threads_per_worker)
    client = remote_from_args(args, args.max_workers or local.n_workers) or local.start()
    try:
        plan = plan_for_target(client, store, spec, corpus, target_nll=args.target_nll, max_workers=args.max_workers,
                               lr_rule=rule, probe_seconds=args.probe_seconds, fresh=args.fresh,
                               calibration_budget_s=args.calibration_seconds,
                               eval_every_samples=args.eval_every_samples, say=lambda text: say(args, text))
    finally:
        shutdown(client)
    out = plan.to_dict()
    out["train_command"] = train_command(args, out["recommended"])
    if not args.json:
        print_plan(out)
    return out


def train_command(args: argparse.Namespace, row: dict[str, Any]) -> str:
    """The ``train`` command line that runs ``row`` (the model flags the plan was given carried over)."""
    words = ["python", "-m", "petmodel", "train", "--workers", str(row["workers"]), "--batch-size",
             str(row["batch_per_worker"]), "--lr", f"{row['lr']:g}"]
    for flag, value in (("--data", args.data), ("--scheduler", args.scheduler), ("--store", args.store)):
        if value:
            words += [flag, str(value)]
    for flag, key in (("--embed", "embed"), ("--hidden", "hidden"), ("--layers", "layers"), ("--dropout", "dropout")):
        if getattr(args, key) != getattr(DEFAULT_SPEC, key):
            words += [flag, f"{getattr(args, key):g}"]
    return shlex.join(words)


def print_plan(out: dict[str, Any]) -> None:
    print(f"Plan: time to validation NLL ≤ {out['target_nll']:g} on the training clock (forecast; made in "
          f"{out['seconds']:.1f} s, nothing kept):")
    print(f"{'':2}{'workers':>7} {'global':>7} {'per-wkr':>7} {'lr':>7} {'steps':>6} {'step ms':>8} "
          f"{'t→target':>9} {'range s':>13}")
    for i, r in enumerate(out["rows"]):
        mark = "→ " if i == 0 else "  "
        print(f"{mark}{r['workers']:>7} {r['global_batch']:>7} {r['batch_per_worker']:>7} {r['lr']:>7g} "
              f"{r['steps']:>6.0f} {r['step_s'] * 1e3:>8.1f} {r['time_s']:>9.1f} "
              f"{r['time_low_s']:>6.1f}–{r['time_high_s']:<6.1f}")
    for line in out["why"]:
        print(f"why: {line}")
    print(f"rule: {out['lr_rule']}")
    for line in out["notes"]:
        print(f"note: {line}")
    print(f"run it: {out['train_command']}")
