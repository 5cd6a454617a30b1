"""What the step-time breakdown costs: 2-worker DDP with the recording on against off, alternated.

    python -m benchmarks.bench_step_timing [--batch 256] [--seconds 12] [--repeats 3] [--json] [--quick]

The loop times a step part by part and wraps DDP's all-reduce in a hook (:mod:`petmodel.step_timing`);
``PETMODEL_STEP_TIMING=0`` on the workers turns both off. On one embedded cluster of 2 workers × 1
thread, this runs the same 2-worker run with the recording on and off, alternating (on, off, off, on,
…, so a drift of the machine weighs on both), and reports the median steady samples/s of each and
their ratio. The goal is a cost under 1% (ratio ≥ 0.99).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from typing import Any

from benchmarks._common import fmt, load_avg, machine_info, print_json, resolve_data, table
from benchmarks.bench_ddp import run_one


def _set_step_timing(on: bool) -> None:
    """Runs on each worker: the recording on or off for the runs that start after it."""
    import os

    os.environ["PETMODEL_STEP_TIMING"] = "1" if on else "0"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="CSV of pet names (default: the packaged snapshot)")
    ap.add_argument("--batch", type=int, default=None, help="per-worker batch (default 256)")
    ap.add_argument("--seconds", type=float, default=None, help="training budget per run (default 12)")
    ap.add_argument("--repeats", type=int, default=None, help="pairs of runs, on and off (default 3)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--quick", action="store_true", help="tiny budgets (smoke test): not a measurement")
    args = ap.parse_args(argv)
    q = args.quick
    batch = args.batch or (64 if q else 256)
    seconds = args.seconds if args.seconds is not None else (1.0 if q else 12.0)
    repeats = args.repeats if args.repeats is not None else (1 if q else 3)
    data = resolve_data(args.data)

    from petmodel.cluster.connect import shutdown
    from petmodel.cluster.local import start_local_cluster
    from petmodel.cluster.workers import describe_workers
    from petmodel.data import load_corpus
    from petmodel.store import RunStore

    corpus = load_corpus(data)
    client = start_local_cluster(2, 1)
    runs: list[dict[str, Any]] = []
    try:
        addrs = [w.address for w in describe_workers(client)]
        pids = [p for p in client.run(lambda: __import__("os").getpid()).values()]
        with tempfile.TemporaryDirectory(prefix="petmodel-bench-step-timing-") as tmp:
            store = RunStore(tmp)
            run_one(client, store, corpus, data, addrs, workers=2, batch=batch, seconds=0.5 if q else 2.0,
                    steps=None, worker_pids=pids)  # warm-up: a fresh cluster's one-off costs
            order = [m for rep in range(repeats) for m in ((True, False) if rep % 2 == 0 else (False, True))]
            for on in order:
                client.run(_set_step_timing, on)
                r = run_one(client, store, corpus, data, addrs, workers=2, batch=batch, seconds=seconds,
                            steps=None, worker_pids=pids)
                r["step_timing"] = on
                runs.append(r)
                print(f"  recording {'on ' if on else 'off'}: steady {fmt(r['steady_samples_per_s'], 0)} samples/s, "
                      f"median step {fmt(r['median_step_ms'], 2)} ms", file=sys.stderr, flush=True)
    finally:
        shutdown(client)

    def median(on: bool, key: str) -> float | None:
        vals = [r[key] for r in runs if r["step_timing"] is on and r.get(key)]
        return statistics.median(vals) if vals else None

    on_rate, off_rate = median(True, "steady_samples_per_s"), median(False, "steady_samples_per_s")
    ratio = on_rate / off_rate if on_rate and off_rate else None
    print(table(["recording", "runs", "steady samples/s (median)", "median step ms"],
                [[label, sum(r["step_timing"] is on for r in runs), fmt(median(on, "steady_samples_per_s"), 0),
                  fmt(median(on, "median_step_ms"), 2)] for label, on in (("on", True), ("off", False))],
                title=f"Step-time recording, 2 workers × batch {batch}, {seconds:g} s runs, load avg {load_avg()}"))
    print(f"\nrecording on / off = {fmt(ratio, 3)}× samples/s (goal ≥ 0.99: a cost under 1%)")
    if q:
        print("(--quick: tiny budgets; not a measurement)")
    result = {"benchmark": "step_timing", "quick": q, "batch": batch, "seconds": seconds, "repeats": repeats,
              **machine_info(), "on_samples_per_s": on_rate, "off_samples_per_s": off_rate, "ratio": ratio,
              "goal": 0.99, "runs": [{k: r.get(k) for k in ("step_timing", "steady_samples_per_s", "median_step_ms",
                                                            "samples_per_s", "steps", "foreign_load")} for r in runs]}
    if args.json:
        print_json(result)
    return result


if __name__ == "__main__":
    main()
