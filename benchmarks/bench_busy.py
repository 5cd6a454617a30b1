"""Default training beside a busy process: how much of its quiet speed it keeps (issue 52, target ≥ 80%).

    python -m benchmarks.bench_busy [--seconds 20] [--repeats 3] [--busy 1] [--baseline] [--wait-quiet S]
                                    [--env K=V ...] [--json] [--quick]

A laptop or a shared node rarely has every core free. Each repeat runs the default command,
``python -m petmodel train --max-seconds S --json --quiet`` (training in that process), twice: once
on its own and once beside ``--busy`` processes that spin (``python -c "while True: pass"``, started
before it, so the trainer sees them from its start). The order alternates from one repeat to the next
and each busy run is compared with the quiet run of its own repeat: adjacent runs share the machine's
state, so the paired ratios resist a shared machine's drift. samples/s is train's own (names per
second of training time, validation excluded); threads, the ``torch_threads`` it chose. "other load"
is the cores that processes other than this benchmark and its children used during the run: a quiet
run with other load is not quiet, and ``--wait-quiet`` waits for a quiet machine and runs such a run
again. ``--baseline`` also runs every pair with ``$PETMODEL_THREADS`` at torch's default (every core,
as ``train`` did before issue 52), interleaved; ``--env K=V`` sets a variable for the trainers (not the
spinners), to compare other choices.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from benchmarks._common import (REPO_ROOT, cpu_snapshot, foreign_load, load_avg, machine_info, print_json, table,
                                wait_quiet)
from petmodel.threads import THREADS_ENV

TARGET = 0.80  # issue 52: busy samples/s ≥ 80% of quiet
NOISY = 0.2  # cores of other processes' load that make a run not count as measured on a quiet machine
SPIN = "while True: pass"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def spinners(n: int) -> Iterator[None]:
    """``n`` processes that each keep one core busy for as long as the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def train_once(seconds: float, store: str, env: dict[str, str], data: str | None) -> dict[str, Any]:
    """One default ``train`` run in a child process; its JSON line plus the other load during it."""
    cmd = [sys.executable, "-m", "petmodel", "train", "--max-seconds", str(seconds), "--json", "--quiet",
           "--store", store, *(["--data", data] if data else [])]
    before = cpu_snapshot()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=seconds * 6 + 120)
    other = foreign_load(before, cpu_snapshot())
    if proc.returncode != 0:
        raise SystemExit(f"bench_busy: train failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    row = json.loads([line for line in proc.stdout.splitlines() if line.strip()][-1])
    return {"samples_per_s": row["samples_per_s"], "train_seconds": row["train_seconds"], "steps": row["steps"],
            "torch_threads": row.get("torch_threads"), "other_load": other}


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and range of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"bench_busy: --env takes KEY=VALUE, not {pair!r}.")
        out[key] = value
    return out


def measure(seconds: float, store: str, env: dict[str, str], busy: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run beside ``busy`` spinners; with ``--wait-quiet``, after a quiet moment, and run again (twice at
    most) when other processes used more than ``NOISY`` cores meanwhile."""
    for _ in range(3 if args.wait_quiet > 0 else 1):
        if args.wait_quiet > 0:
            wait_quiet(args.wait_quiet, log=log)
        with spinners(busy):
            run = train_once(seconds, store, env, args.data)
        if (run["other_load"] or 0.0) <= NOISY:
            break
    return run


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """samples/s quiet and busy, and busy ÷ quiet paired by repeat: each as median and range."""
    quiet = [x["samples_per_s"] for x in runs if not x["busy"]]
    busy = [x["samples_per_s"] for x in runs if x["busy"]]
    ratios = [b / q for q, b in zip(quiet, busy)]  # paired by repeat
    return {"quiet": spread(quiet), "busy": spread(busy), "ratio": spread(ratios)}


def summary_rows(label: str, summary: dict[str, dict[str, float]]) -> list[list[Any]]:
    """The summary table's rows for one variant: quiet, busy and their ratio, each median, min and max."""
    stats = ("median", "min", "max")
    return [[label, what, *(round(summary[key][stat], 3 if key == "ratio" else None) for stat in stats)]
            for key, what in (("quiet", "quiet samples/s"), ("busy", "busy samples/s"), ("ratio", "busy ÷ quiet"))]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=None, help="training seconds per run (default 20; quick 3)")
    ap.add_argument("--repeats", type=int, default=None, help="quiet/busy pairs (default 3; quick 1)")
    ap.add_argument("--busy", type=int, default=1, help="spinning processes beside the busy runs (default 1)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="set for the trainers; repeatable")
    ap.add_argument("--baseline", action="store_true",
                    help=f"also run every pair with {THREADS_ENV} = torch's default (every core, as before issue 52)")
    ap.add_argument("--data", help="training data (default: petmodel's default)")
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help=f"before each run, wait up to S seconds for other processes to use ≤ 0.15 cores; run again "
                         f"(twice at most) when they used more than {NOISY} meanwhile")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--quick", action="store_true", help="tiny budgets (smoke test): not a measurement")
    args = ap.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (3.0 if args.quick else 20.0)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    extra = parse_env(args.env)
    import torch

    all_cores = torch.get_num_threads()  # what the trainer's torch starts with: it inherits this environment
    main_label = " ".join(f"{k}={v}" for k, v in extra.items()) or "default"
    baseline_label = f"{THREADS_ENV}={all_cores}"  # every core, as before issue 52
    if args.baseline and extra.get(THREADS_ENV) == str(all_cores):
        raise SystemExit(f"bench_busy: --baseline already sets {baseline_label}; drop it from --env.")
    variants = {main_label: {**os.environ, **extra}}
    if args.baseline:
        variants[baseline_label] = {**os.environ, **extra, THREADS_ENV: str(all_cores)}
    load_start = load_avg()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_busy_") as store:
        for r in range(repeats):
            for label in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                for busy in ((False, True) if r % 2 == 0 else (True, False)):
                    run = measure(seconds, store, variants[label], args.busy if busy else 0, args)
                    run.update(variant=label, repeat=r + 1, busy=busy)
                    runs.append(run)
                    log(f"repeat {r + 1} {label} {'busy ' if busy else 'quiet'}: {run['samples_per_s']:,.0f} "
                        f"samples/s, threads {run['torch_threads']}, other load {run['other_load'] or 0:.2f}")
    summaries = {label: summarise([x for x in runs if x["variant"] == label]) for label in variants}
    load_end = load_avg()

    print(table(["variant", "repeat", "beside", "samples/s", "train s", "steps", "threads", "other load"],
                [[x["variant"], x["repeat"], f"{args.busy} busy" if x["busy"] else "nothing", round(x["samples_per_s"]),
                  x["train_seconds"], x["steps"], x["torch_threads"] if x["torch_threads"] is not None else "–",
                  round(x["other_load"], 2) if x["other_load"] is not None else None] for x in runs],
                title=f"python -m petmodel train --max-seconds {seconds:g}"
                      f"{''.join(f' ({k}={v})' for k, v in extra.items())}; load avg {load_start} → {load_end}"))
    print()
    print(table(["variant", "", "median", "min", "max"],
                [row for label, summary in summaries.items() for row in summary_rows(label, summary)],
                title=f"{repeats} repeats, {args.busy} busy process(es) beside the busy runs; "
                      f"target busy ÷ quiet ≥ {TARGET:.0%}"))
    summary = summaries[main_label]
    met = summary["ratio"]["median"] >= TARGET
    print(f"\nbusy ÷ quiet, median {summary['ratio']['median']:.0%}: target {'met' if met else 'missed'} "
          f"({machine_info()['cpus']} CPUs; other load: cores used by processes other than this benchmark)")
    if args.quick:
        print("(--quick: tiny budgets; not a measurement)")
    result = {"benchmark": "busy", "quick": args.quick, "seconds": seconds, "repeats": repeats,
              "busy_processes": args.busy, "env": extra, "target_ratio": TARGET, "target_met": met,
              "load_avg_start": load_start, "load_avg_end": load_end, **machine_info(), "runs": runs, **summary,
              "baseline": summaries.get(baseline_label)}
    if args.json:
        print_json(result)
    return result


if __name__ == "__main__":
    main()
