"""Is a training step slower inside a Dask worker? Same loop, same thread count, three places.

    python -m benchmarks.dask_overhead [--data PATH] [--steps 200] [--json]

Runs ``petmodel.train.train_model`` (1 thread, no validation, batch 128, fixed steps) in
(a) a plain spawned process, (b) a task on a ``start_local_cluster(2, 1)`` worker (no DDP),
(c) the same task while the other worker is busy with the same work, and reports the median
step time from the per-step metric rows. (a) vs (b) isolates the cost of the Dask worker
process itself (event loop thread, heartbeats, GIL); (c) adds the cost of sharing 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from benchmarks._common import cpu_snapshot, fmt, foreign_load, load_avg, print_json, resolve_data, table


def _steps(data: str, steps: int, batch: int, emit: bool = False) -> dict[str, Any]:
    import time

    import torch

    torch.set_num_threads(1)
    from petmodel.config import RunSpec, TrainConfig
    from petmodel.data import encode_names, load_corpus
    from petmodel.train import train_model

    corpus = load_corpus(data)
    tr = encode_names(corpus.train_names, corpus.alphabet)
    rows: list[dict[str, Any]] = []
    on_metrics = rows.append
    if emit:  # what a DDP rank does per step in petmodel.cluster.ranks: batch rows into Dask events
        from petmodel.cluster.ranks import _EventEmitter

        emitter = _EventEmitter("bench-dask-overhead")

        def on_metrics(row: dict[str, Any]) -> None:
            rows.append(row)
            emitter(row)
    t = time.perf_counter()
    train_model(RunSpec().model_config(corpus.alphabet.vocab_size),
                TrainConfig(max_seconds=None, max_steps=steps, batch_size=batch), tr, None, on_metrics=on_metrics)
    wall = time.perf_counter() - t
    el = [r["elapsed"] for r in rows if r["kind"] == "train"]
    dts = [b - a for a, b in zip(el[5:], el[6:])]
    return {"median_step_ms": statistics.median(dts) * 1000, "mean_step_ms": statistics.fmean(dts) * 1000,
            "wall_s": wall, "threads": torch.get_num_threads()}


def _plain(data: str, steps: int, batch: int, q: Any) -> None:
    q.put(_steps(data, steps, batch))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args(argv)
    data = resolve_data(args.data)
    import multiprocessing as mp

    from petmodel.cluster.connect import shutdown
    from petmodel.cluster.local import start_local_cluster
    from petmodel.cluster.workers import describe_workers

    out = []
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    snap = cpu_snapshot()
    p = ctx.Process(target=_plain, args=(data, args.steps, args.batch, q))
    p.start()
    r = q.get()
    p.join()
    out.append({"where": "plain process", **r, "foreign_load": foreign_load(snap, cpu_snapshot())})
    client = start_local_cluster(2, 1)
    try:
        addrs = [w.address for w in describe_workers(client)]
        for emit in (False, True):
            snap = cpu_snapshot()
            r = client.submit(_steps, data, args.steps, args.batch, emit, workers=[addrs[0]], pure=False).result()
            out.append({"where": "Dask worker, other idle" + (", events" if emit else ""), **r,
                        "foreign_load": foreign_load(snap, cpu_snapshot())})
        snap = cpu_snapshot()
        futs = [client.submit(_steps, data, args.steps, args.batch, True, workers=[a], pure=False) for a in addrs]
        for i, f in enumerate(futs):
            out.append({"where": f"Dask worker {i}, both busy, events", **f.result(), "foreign_load": None})
        out[-1]["foreign_load"] = out[-2]["foreign_load"] = foreign_load(snap, cpu_snapshot())
    finally:
        shutdown(client)
    print(table(["where", "torch threads", "median step ms", "mean step ms", "other load"],
                [[o["where"], o["threads"], round(o["median_step_ms"], 1), round(o["mean_step_ms"], 1),
                  fmt(o["foreign_load"])] for o in out],
                title=f"train_model, batch {args.batch}, {args.steps} steps, 1 thread, no validation; load avg {load_avg()}"))
    result = {"benchmark": "dask_overhead", "rows": out}
    if args.json:
        print_json(result)
    return result


if __name__ == "__main__":
    main()
