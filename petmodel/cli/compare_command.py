"""``python -m petmodel runs compare RUN_ID… [--baseline RUN_ID] [--target-nll X]``: the comparison figures.

The figures are :mod:`petmodel.comparison`'s, as on the Compare and Experiments pages and in a sweep's
table: time to the target on the training clock, and a speedup only against a measured equivalent
1-worker run (or the ``--baseline`` given, flagged when it is not equivalent); otherwise none, with why.
"""

from __future__ import annotations

import argparse
from typing import Any

from petmodel.cli.args import add_store_options
from petmodel.errors import PetmodelError

CANDIDATES = 1000  # the newest runs of the store a default baseline is looked for among


def add_runs_compare(sub: Any) -> None:
    """Flags default to SUPPRESS, as ``runs delete``'s, so ``runs --store X compare …`` keeps its --store."""
    c = sub.add_parser("compare", help="time to a target NLL and the speedup over an equivalent 1-worker run",
                       description="Each run's time to the target validation NLL on the training clock (start-up "
                                   "and validation pauses left out), interpolated between the validations either side of it, and its "
                                   "speedup and efficiency against a measured 1-worker run with the same model, data, "
                                   "learning rate and global batch (its study's own, else the most recent one in the "
                                   "store). Without such a run there is no speedup, and the reason says so.")
    c.add_argument("run_ids", nargs="+", metavar="RUN",
                   help="a run id, a unique start of one, a run's name, best or latest (as generate's --model)")
    c.add_argument("--baseline", metavar="RUN", default=argparse.SUPPRESS,
                   help="compare with this run instead (flagged when it is not equivalent)")
    c.add_argument("--target-nll", type=float, metavar="X", default=argparse.SUPPRESS,
                   help="validation NLL to time (default: the worst of the runs' best NLLs, so every run reached it)")
    add_store_options(c, subcommand=True)
    c.set_defaults(handler=cmd_runs_compare)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def cmd_runs_compare(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.analysis import default_target
    from petmodel.cli.args import open_store
    from petmodel.comparison import baseline_pool, compare_runs

    store = open_store(getattr(args, "store", None), existing=True)
    runs = []
    for ref in dict.fromkeys(args.run_ids):  # an id, its start, a run's name, best or latest, as --model reads
        run = store.find_run(ref)
        if run.id not in {r.id for r in runs}:
            runs.append(run)
    baseline = store.find_run(args.baseline) if getattr(args, "baseline", None) else None
    candidates = baseline_pool(runs, store.list_runs(limit=CANDIDATES))
    frame = store.metrics_frame(sorted({r.id for r in [*runs, *candidates, *([baseline] if baseline else [])]}))
    target = getattr(args, "target_nll", None)
    if target is None:
        target = default_target(runs, frame)
    if target is None:
        raise PetmodelError("None of these runs has a validation point yet, so there is no time to a target.")
    figures = compare_runs(runs, frame, float(target), candidates=candidates, baseline=baseline)
    if not getattr(args, "json", False):
        print(f"Time to validation NLL ≤ {target:g} on the training clock (start-up and validation pauses left out):")
        print(f"{'run':<22} {'workers':>7} {'global':>7} {'lr':>7} {'time (s)':>9} {'speedup':>8} {'effic.':>7}  "
              "baseline / note")
        for f in figures:
            note = f.baseline_id or ""
            if f.reason:
                note = f"{note}: {f.reason}" if note else f.reason
            efficiency = None if f.efficiency is None else 100 * f.efficiency
            print(f"{f.run_id:<22} {f.workers:>7} {f.global_batch:>7} {f.lr:>7g} {_fmt(f.time_to_target, '.2f'):>9} "
                  f"{_fmt(f.speedup, '.2f', '×'):>8} {_fmt(efficiency, '.0f', '%'):>7}  {note}")
    return {"store": str(store.root), "target_nll": float(target), "runs": [f.to_dict() for f in figures]}
