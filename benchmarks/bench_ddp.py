"""DDP scaling on the real data through the real path: 1 worker × 1 thread vs 2 workers × 1 thread.

    python -m benchmarks.bench_ddp [--data PATH] [--json] [--quick] [--batches 128,256,1024] [--seconds 15]

Starts ``petmodel.cluster.local.start_local_cluster(2, 1)``, then for each per-worker batch runs
``petmodel.cluster.launch.launch_run`` on 1 and on 2 workers with a temporary RunStore and a time
budget, and reads ``samples_per_s`` (global samples / train seconds) from the result dict.
The goal is 2 workers ≥ 1.8 × 1 worker at the same per-worker batch. A 2-second warm-up run
(0.5 s with ``--quick``) comes first; ``--repeats`` alternates 1 and 2 workers and reports medians. The cluster is the
library's as-is (glibc malloc left adaptive, Dask's monitors slowed, each rank of a multi-rank
run pinned to its own core); ``--malloc dask`` and ``--no-pin`` undo parts of that for an A/B.

Besides the result dict's figure (which counts rank 0's validations and the first, slow
steps in its train seconds), it reports a steady-state rate from the per-step metric rows
(steps after the first few, leaving out steps that include a validation), the median step
time, and the time spent in validations, so the gap to the goal can be attributed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

from benchmarks._common import (cpu_snapshot, fmt, foreign_load, load_avg, machine_info, print_json, resolve_data,
                                busiest_threads, table, tree_threads_snapshot, wait_quiet)

WARMUP_STEPS = 3


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _worker_facts() -> dict[str, Any]:
    import os
    import threading

    import torch

    facts = {"pid": os.getpid(), "torch_threads": torch.get_num_threads(),
             "malloc_trim_threshold_env": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
             "interop_threads": torch.get_num_interop_threads(), "py_threads": threading.active_count()}
    try:
        facts["os_threads"] = len(os.listdir(f"/proc/{os.getpid()}/task"))
        facts["affinity"] = sorted(os.sched_getaffinity(0))
    except OSError:
        pass
    return facts


def _dask_malloc() -> int:
    """Runs on each worker: what Dask's nanny does with MALLOC_TRIM_THRESHOLD_=65536 (glibc only).

    A fixed trim threshold also stops glibc adapting its mmap threshold, so every tensor over
    128 KiB is a fresh mmap/munmap (page faults each step). petmodel's workers avoid it.
    """
    import ctypes

    m_trim_threshold = -1
    return ctypes.CDLL("libc.so.6").mallopt(m_trim_threshold, 65536)


def _no_pin() -> None:
    """Runs on each worker: turn off the library's CPU pinning of multi-rank runs (for an A/B)."""
    import os

    os.environ["PETMODEL_PIN_CPUS"] = "0"


def steady_stats(rows: list[dict[str, Any]], world: int, batch: int, train_seconds: float | None) -> dict[str, Any]:
    """Rank 0's per-step timing: steady samples/s and median step, validations left out.

    Only validations inside the timed loop count (the final one runs after train seconds stop).
    """
    train = sorted((r for r in rows if r.get("kind") == "train" and r.get("rank") == 0), key=lambda r: r["step"])
    limit = train_seconds if train_seconds is not None else float("inf")
    val = [r for r in rows if r.get("kind") == "val" and r["elapsed"] <= limit + 1e-3]
    elapsed = {r["step"]: r["elapsed"] for r in train}
    val_steps = {r["step"] for r in val}
    eval_s = sum(max(0.0, r["elapsed"] - elapsed.get(r["step"], r["elapsed"])) for r in val)
    dts = []
    for r in train:
        s = r["step"]
        if s <= WARMUP_STEPS or (s - 1) not in elapsed or (s - 1) in val_steps:
            continue
        dts.append(r["elapsed"] - elapsed[s - 1])
    first = elapsed.get(WARMUP_STEPS)
    out = {"steps_seen": len(train), "val_evals": len(val), "eval_seconds": eval_s,
           "first_steps_s": first, "median_step_ms": statistics.median(dts) * 1000 if dts else None,
           "mean_step_ms": statistics.fmean(dts) * 1000 if dts else None,
           "steady_samples_per_s": len(dts) * batch * world / sum(dts) if dts else None}
    # The same, excluding only validations (warm-up kept): what the result dict would say without them.
    if train:
        total = train[-1]["elapsed"] - eval_s  # last step's end, minus validations inside the loop
        out["no_eval_samples_per_s"] = train[-1]["samples"] * world / total if total > 0 else None
    return out


def run_one(client, store, corpus, data: str, addrs: list[str], *, workers: int, batch: int, seconds: float,
            steps: int | None, worker_pids: list[int]) -> dict[str, Any]:
    from petmodel.config import RunSpec, TrainConfig
    from petmodel.cluster.launch import launch_run

    spec = RunSpec(train=TrainConfig(max_seconds=seconds, batch_size=batch, max_steps=steps), data=data,
                   workers=workers, name=f"bench-ddp-{workers}w-b{batch}")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    snap0 = cpu_snapshot()
    threads0 = tree_threads_snapshot()
    handle = launch_run(client, spec, store, corpus=corpus, workers=addrs[:workers], on_metrics=rows.append)
    res = handle.wait(timeout=seconds * 4 + 180)
    wall = time.perf_counter() - t0
    foreign = foreign_load(snap0, cpu_snapshot())
    procs = busiest_threads(threads0, tree_threads_snapshot(), wall)
    rank_pids = set(worker_pids[:workers])
    # CPU that is not a rank's compute thread: this process (client, scheduler, monitor), nannies,
    # idle workers, and the workers' other threads (event loop, gloo, comms).
    machinery = sum(p["cores"] - (p["top_thread_cores"] if p["pid"] in rank_pids else 0.0) for p in procs)
    time.sleep(0.3)  # let the last metric events drain
    ranks = handle.rank_results
    out = {"workers": workers, "batch": batch, "global_batch": res.get("global_batch"),
           "samples_per_s": res.get("samples_per_s"), "train_seconds": res.get("train_seconds"),
           "samples": res.get("samples"), "steps": res.get("steps"), "stopped_by": res.get("stopped_by"),
           "val_nll": res.get("val_nll"), "backend": res.get("backend"), "wall_seconds": wall,
           "overhead_seconds": wall - (res.get("train_seconds") or 0.0), "foreign_load": foreign,
           "machinery_cores": machinery, "processes": procs,
           "load_avg": load_avg(),
           "rank_train_seconds": [r.get("train_seconds") for r in ranks]}
    out.update(steady_stats(rows, workers, batch, ranks[0].get("train_seconds") if ranks else None))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="CSV of pet names (default: the data petmodel trains on by default, the packaged snapshot)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--quick", action="store_true", help="tiny budgets (smoke test): not a measurement")
    ap.add_argument("--batches", default=None, help="per-worker batch sizes, comma-separated (default 128,256,1024: the app's default and the write-up's smallest)")
    ap.add_argument("--seconds", type=float, default=None, help="training budget per run (default 15)")
    ap.add_argument("--steps", type=int, default=None, help="fixed optimiser steps per run instead of a budget")
    ap.add_argument("--repeats", type=int, default=None, help="runs per configuration, alternating 1w/2w (1)")
    ap.add_argument("--max-foreign", type=float, default=0.15,
                    help="rerun a configuration when other processes used more than this many cores meanwhile")
    ap.add_argument("--retries", type=int, default=None, help="reruns allowed per configuration (default 2; quick 0)")
    ap.add_argument("--wait-quiet", type=float, default=0.0,
                    help="before each run, wait up to this many seconds for other processes to use ≤ 0.15 cores")
    ap.add_argument("--malloc", choices=("library", "dask"), default="library",
                    help="library: glibc's adaptive thresholds, as petmodel starts its workers; dask: a fixed "
                         "trim threshold of 64 KiB, as Dask's nanny sets it (to measure what that costs)")
    ap.add_argument("--dask-tune", action="store_true",
                    help="also turn the workers' statistical profiler off (petmodel already slows it to 10 "
                         "samples a second and its memory/system monitors to 1 s / 2 s)")
    ap.add_argument("--no-pin", action="store_true",
                    help="turn off the library's pinning of each rank to its own cores (PETMODEL_PIN_CPUS=0)")
    args = ap.parse_args(argv)
    q = args.quick
    batches = [int(b) for b in (args.batches or ("128" if q else "128,256,1024")).split(",")]
    seconds = args.seconds if args.seconds is not None else (0.5 if q else 15.0)
    repeats = args.repeats if args.repeats is not None else 1
    retries = args.retries if args.retries is not None else (0 if q else 2)
    data = resolve_data(args.data)

    from petmodel.data import load_corpus
    from petmodel.cluster.connect import shutdown
    from petmodel.cluster.local import start_local_cluster
    from petmodel.cluster.workers import describe_workers
    from petmodel.store import RunStore

    load_start = load_avg()
    log(f"bench_ddp: load average {load_start}; starting a local cluster of 2 workers × 1 thread")
    corpus = load_corpus(data)
    import dask

    overrides: dict[str, Any] = {}
    if args.dask_tune:
        overrides["distributed.worker.profile.enabled"] = False  # the library's own settings win for the rest
    with dask.config.set(overrides):
        client = start_local_cluster(2, 1)
    results: list[dict[str, Any]] = []
    try:
        addrs = [w.address for w in describe_workers(client)]
        if args.malloc == "dask":
            client.run(_dask_malloc)
        facts = client.run(_worker_facts)
        if args.no_pin:
            client.run(_no_pin)
        with tempfile.TemporaryDirectory(prefix="petmodel-bench-ddp-") as tmp:
            store = RunStore(tmp)
            # Warm-up, not measured: the first run on a fresh cluster pays one-off costs (imports,
            # first allocations, gloo's first connection) that would count against whichever comes first.
            if not q:
                run_one(client, store, corpus, data, addrs, workers=2, batch=batches[0], seconds=2.0, steps=None,
                        worker_pids=[facts[a]["pid"] for a in addrs])
            for batch in batches:
                for rep in range(repeats):
                    for n in (1, 2):
                        tries = []
                        for attempt in range(retries + 1):
                            if args.wait_quiet > 0:
                                wait_quiet(args.wait_quiet, args.max_foreign, log=log)
                            r = run_one(client, store, corpus, data, addrs, workers=n, batch=batch, seconds=seconds,
                                        steps=args.steps, worker_pids=[facts[a]["pid"] for a in addrs])
                            r["repeat"], r["attempt"] = rep, attempt
                            tries.append(r)
                            log(f"  batch {batch} × {n} worker(s): {r['samples_per_s']} samples/s (result dict), "
                                f"steady {fmt(r['steady_samples_per_s'], 0)}, median step "
                                f"{fmt(r['median_step_ms'], 1)} ms; other processes used "
                                f"{fmt(r['foreign_load'])} cores")
                            if r["foreign_load"] is None or r["foreign_load"] <= args.max_foreign:
                                break
                        r = min(tries, key=lambda x: x["foreign_load"] if x["foreign_load"] is not None else 0.0)
                        r["attempts"] = len(tries)
                        results.append(r)
            facts_after = client.run(_worker_facts)
    finally:
        shutdown(client)
    load_end = load_avg()

    def best(batch: int, n: int, key: str) -> float | None:
        vals = [r[key] for r in results if r["batch"] == batch and r["workers"] == n and r.get(key)]
        return statistics.median(vals) if vals else None

    ratios: dict[str, Any] = {}
    for batch in batches:
        one, two = best(batch, 1, "samples_per_s"), best(batch, 2, "samples_per_s")
        s1, s2 = best(batch, 1, "steady_samples_per_s"), best(batch, 2, "steady_samples_per_s")
        ratios[str(batch)] = {"result_dict": two / one if one and two else None,
                              "steady": s2 / s1 if s1 and s2 else None}

    rows = [[r["batch"], r["workers"], r["global_batch"], r["steps"], round(r["train_seconds"], 2),
             round(r["samples_per_s"]) if r["samples_per_s"] else None,
             round(r["steady_samples_per_s"]) if r["steady_samples_per_s"] else None,
             round(r["median_step_ms"], 1) if r["median_step_ms"] else None, r["val_evals"],
             round(r["eval_seconds"], 2), round(r["overhead_seconds"], 1),
             round(r["machinery_cores"], 2),
             round(r["foreign_load"], 2) if r["foreign_load"] is not None else None] for r in results]
    print(table(["batch/worker", "workers", "global", "steps", "train s", "samples/s", "steady/s", "median step ms",
                 "val evals", "val s", "launch+finish s", "dask etc. cores", "other load"], rows,
                title=f"DDP on a LocalCluster(2 workers × 1 thread), gloo"
                      f"{' [malloc ' + args.malloc + ']' if args.malloc != 'library' else ''}"
                      f"{' [dask-tune]' if args.dask_tune else ''}{' [not pinned]' if args.no_pin else ''}"
                      f"; load avg {load_start} → {load_end}"))
    print()
    for batch, r in ratios.items():
        print(f"batch {batch}/worker: 2 workers / 1 worker = {fmt(r['result_dict'])}× (result dict samples_per_s), "
              f"{fmt(r['steady'])}× (steady state)  [goal ≥ 1.8]")
    thr = sorted({(f["torch_threads"], f["interop_threads"]) for f in facts.values()})
    print(f"worker torch threads (intra, inter-op): {thr}; OS threads per worker: "
          f"{[f.get('os_threads') for f in facts_after.values()]}")
    if q:
        print("(--quick: tiny budgets; not a measurement)")
    result = {"benchmark": "ddp", "quick": q, "seconds": seconds, "steps": args.steps, "batches": batches,
              "malloc": args.malloc, "dask_tune": args.dask_tune, "pin": not args.no_pin, "load_avg_start": load_start, "load_avg_end": load_end, **machine_info(),
              "results": results, "ratios": ratios,
              "ratio_2w_over_1w": ratios[str(batches[0])]["result_dict"], "goal": 1.8,
              "best_ratio": max((r["result_dict"] for r in ratios.values() if r["result_dict"]), default=None),
              "worker_facts": list(facts.values()), "worker_facts_after": list(facts_after.values())}
    if args.json:
        print_json(result)
    return result


if __name__ == "__main__":
    main()
