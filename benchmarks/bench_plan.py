"""The plan checked against measurement: is its recommendation the fastest setting, and are its forecasts in order?

    python -m benchmarks.bench_plan [--target-nll 2.25] [--max-workers 2] [--probe-seconds 150] [--json] [--quick]

1. ``python -m petmodel plan --target-nll X --max-workers N --json``, as a user runs it (its own embedded
   cluster, probes and calibration), timed.
2. Then, on one embedded cluster, every cell of a grid is *trained* and its time to the target measured on
   the training clock (:mod:`petmodel.comparison`, as every page measures it): 1 and N workers × three global
   batches (the recommendation's and two others about 4× either side of it, among the plan's candidates),
   learning rates by the plan's rule, each pair as an equivalent sweep validating every 1,024 samples as the
   plan assumes; plus the write-up's recipe scaled to this data (the most workers, the largest global batch
   the data fills, the write-up's largest learning rate 0.016).
3. Printed: the plan's time, each cell's forecast and measured time, the Spearman rank correlation between
   them, and the **regret**: the recommendation's measured time ÷ the best measured time − 1.

A cell that does not reach the target within its cap (3× its forecast's high end, 20–240 s; the recipe 120 s)
is censored: it ranks last, and its time is reported as "> cap".
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import fmt, load_avg, machine_info, print_json, table

DEFAULTS = {"target_nll": 2.25, "max_workers": 2, "probe_seconds": 150.0, "calibration_seconds": 12.0,
            "hidden": None, "embed": None}
QUICK = {"target_nll": 3.0, "max_workers": 2, "probe_seconds": 20.0, "calibration_seconds": 2.0, "hidden": 32,
         "embed": 8}
WRITEUP_LR = 0.016  # the write-up's largest learning rate (petmodel.studies.defaults.WRITEUP_LRS)
CAP = {False: (20.0, 240.0), True: (4.0, 15.0)}  # a cell's training budget, by --quick


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_plan(args: argparse.Namespace, store: Path) -> tuple[dict[str, Any], float]:
    """``python -m petmodel plan … --json`` in this process: its JSON object and its wall time."""
    from petmodel.cli import main

    flags = ["plan", "--target-nll", str(args.target_nll), "--max-workers", str(args.max_workers),
             "--probe-seconds", str(args.probe_seconds), "--calibration-seconds", str(args.calibration_seconds),
             "--store", str(store), "--fresh", *model_flags(args), "--json"]
    out = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out):
        code = main(flags)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    if code != 0 or not lines:
        raise RuntimeError(f"plan exited {code}: {out.getvalue()[-2000:]}")
    return json.loads(lines[-1]), time.monotonic() - started


def model_flags(args: argparse.Namespace) -> list[str]:
    return [w for flag, v in (("--hidden", args.hidden), ("--embed", args.embed)) if v for w in (flag, str(v))]


def grid_batches(plan: dict[str, Any]) -> list[int]:
    """The recommendation's global batch and two others about 4× either side (two candidates away), among the
    plan's candidates; at an edge of the range, the two next ones 4× and 16× away on the other side."""
    candidates = sorted({r["global_batch"] for r in plan["rows"]})
    i = candidates.index(plan["recommended"]["global_batch"])
    last = len(candidates) - 1
    picks = [i - 2, i, i + 2] if 2 <= i <= last - 2 else [i, i + 2, i + 4] if i < 2 else [i - 4, i - 2, i]
    chosen = {min(max(j, 0), last) for j in picks}
    for j in sorted(range(len(candidates)), key=lambda j: abs(j - i)):  # a short range: the nearest ones
        if len(chosen) >= min(3, len(candidates)):
            break
        chosen.add(j)
    return [candidates[j] for j in sorted(chosen)]


def measure(args: argparse.Namespace, plan: dict[str, Any], store: Path) -> list[dict[str, Any]]:
    """Train every cell (see the module docstring); one row per cell with its forecast and measured time."""
    from petmodel.cli.args import open_store
    from petmodel.cluster.connect import shutdown
    from petmodel.config import DEFAULT_SPEC
    from petmodel.data import load_corpus
    from petmodel.studies import SweepConfig, start_sweep
    from petmodel.studies.results import sweep_table
    from petmodel.studies.sizing import LocalStudyCluster

    forecast = {(r["workers"], r["global_batch"]): r for r in plan["rows"]}
    top = max(w for w, _ in forecast)
    base = DEFAULT_SPEC.with_(**{k: v for k, v in (("hidden", args.hidden), ("embed", args.embed)) if v})
    corpus = load_corpus(base.data)
    runs = open_store(str(store))
    cells = [("grid", sorted({1, top}), b, forecast[(1, b)]["lr"]) for b in grid_batches(plan)]
    largest = max(b for _, b in forecast)
    cells.append(("write-up recipe", [top], largest, WRITEUP_LR))
    client = LocalStudyCluster(top).start()
    rows = []
    try:
        for kind, workers, batch, lr in cells:
            low, high = CAP[bool(args.quick)]
            if kind == "grid":
                cap = min(high, max(low, 3 * max(forecast[(w, batch)]["time_high_s"] for w in workers)))
            else:  # a rate the plan did not forecast: half the longest budget
                cap = high / 2
            config = SweepConfig(base=base.with_(max_seconds=cap), workers=workers, global_batches=[batch],
                                 lrs=[lr], target_nll=plan["target_nll"], forecast=False,
                                 name=f"bench_plan {kind} b{batch}")
            log(f"measuring {kind}: {workers} workers at global batch {batch}, lr {lr:g}, cap {cap:.0f} s")
            handle = start_sweep(client, runs, config, corpus=corpus)
            handle.wait()
            for r in sweep_table(runs, handle.study_id, plan["target_nll"]):
                f = forecast.get((r["workers"], batch)) if lr == forecast.get((r["workers"], batch), {}).get("lr") \
                    else None
                rows.append({"kind": kind, "workers": r["workers"], "global_batch": batch, "lr": lr, "cap_s": cap,
                             "forecast_s": f["time_s"] if f else None,
                             "forecast_low_s": f["time_low_s"] if f else None,
                             "forecast_high_s": f["time_high_s"] if f else None,
                             "measured_s": r.get("time_to_target"), "run_id": r.get("run_id")})
    finally:
        shutdown(client)
    return rows


def spearman(pairs: list[tuple[float, float]]) -> float | None:
    """Spearman's rank correlation of (x, y) pairs (average ranks for ties); None for fewer than 3."""
    if len(pairs) < 3:
        return None

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return out

    rx, ry = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else None


def summarise(plan: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Regret and rank correlation over the grid's cells (censored ones rank last)."""
    rec = plan["recommended"]
    measured = [r["measured_s"] for r in rows if r["measured_s"] is not None]
    best = min(measured) if measured else None
    mine = next((r["measured_s"] for r in rows if r["kind"] == "grid" and r["workers"] == rec["workers"]
                 and r["global_batch"] == rec["global_batch"]), None)
    regret = (mine / best - 1) if mine is not None and best else None
    graded = [(r["forecast_s"], r["measured_s"] if r["measured_s"] is not None else float("inf"))
              for r in rows if r["kind"] == "grid" and r["forecast_s"] is not None]
    best_row = min((r for r in rows if r["measured_s"] is not None), key=lambda r: r["measured_s"], default=None)
    return {"regret": regret, "rank_correlation": spearman(graded), "ranked_cells": len(graded),
            "recommended_measured_s": mine, "best_measured_s": best,
            "best_cell": {k: best_row[k] for k in ("kind", "workers", "global_batch", "lr")} if best_row else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--target-nll", type=float)
    p.add_argument("--max-workers", type=int)
    p.add_argument("--probe-seconds", type=float)
    p.add_argument("--calibration-seconds", type=float)
    p.add_argument("--hidden", type=int)
    p.add_argument("--embed", type=int)
    p.add_argument("--quick", action="store_true", help="a tiny model and target: a smoke run, not a measurement")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    load_start = load_avg()
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        log(f"plan --target-nll {args.target_nll} --max-workers {args.max_workers} …")
        plan, plan_wall = make_plan(args, Path(tmp) / "plan-store")
        log(f"plan made in {plan_wall:.1f} s: {plan['recommended']['workers']} workers at global batch "
            f"{plan['recommended']['global_batch']}")
        rows = measure(args, plan, Path(tmp) / "measure-store")
    summary = summarise(plan, rows)
    out = {"benchmark": "plan", "quick": args.quick, "target_nll": args.target_nll, "plan_wall_s": plan_wall,
           "plan_seconds": plan["seconds"], "recommended": plan["recommended"], "why": plan["why"],
           "steps_source": plan["steps_source"], "noise_scale": plan["noise_scale"], "cells": rows, **summary,
           "load_avg_start": load_start, "load_avg_end": load_avg(), "machine": machine_info()}
    rec = plan["recommended"]
    print(table(["cell", "workers", "global batch", "lr", "forecast s", "range s", "measured s"],
                [[r["kind"] + (" ← plan" if (r["kind"] == "grid" and r["workers"] == rec["workers"]
                                              and r["global_batch"] == rec["global_batch"]) else ""),
                  r["workers"], r["global_batch"], f"{r['lr']:g}", r["forecast_s"],
                  f"{fmt(r['forecast_low_s'], 1)}–{fmt(r['forecast_high_s'], 1)}",
                  r["measured_s"] if r["measured_s"] is not None else f"> {r['cap_s']:.0f}"] for r in rows],
                title=f"Plan for NLL {args.target_nll:g} made in {plan_wall:.1f} s; measured on the training clock"))
    print(f"regret {fmt(summary['regret'])}, rank correlation {fmt(summary['rank_correlation'])} over "
          f"{summary['ranked_cells']} cells")
    if args.json:
        print_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
