"""Launch to first training step when the cluster has to grow, against a cluster that already has the workers.

    python -m benchmarks.bench_grow [--repeats 3] [--json] [--quick]

On the embedded cluster (a ``LocalCluster`` of worker processes, the scalable cluster every machine has),
a 2-worker run is launched twice per round: once on a cluster of 1 worker that the launch must grow
to 2 (:mod:`petmodel.cluster.scaling`: "Asked the cluster for 1 more worker"), and once on the grown
cluster whose 2 workers are already there. The figure is the wall time from ``launch_run`` to rank 0's
first training step reaching the client; the difference is what growing costs (a worker process to
start, join and receive this code). After each grown run, the time until the added worker is given
back (grace period 3 s here, so the ready launch finds both; 60 s by default) is measured too. A Dask Gateway cluster adds its own
worker start-up (here a local process too; on Kubernetes or a batch system a pod or a job): this
benchmark measures the library's part on the embedded cluster only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any

from benchmarks._common import fmt, load_avg, machine_info, print_json, resolve_data, table

GRACE_S = 3.0  # idle seconds before an added worker goes: long enough for the "ready" launch to find it


def _first_step(client: Any, spec: Any, store: Any, corpus: Any) -> tuple[float, list[str], dict[str, Any]]:
    """Seconds from the launch call to rank 0's first training step, what the launch said, its result."""
    from petmodel.cluster.launch import launch_run

    first = threading.Event()

    def on_metrics(row: dict[str, Any]) -> None:
        if row.get("kind") == "train" and row.get("rank") == 0:
            first.set()

    said: list[str] = []
    t0 = time.perf_counter()
    handle = launch_run(client, spec, store, corpus=corpus, on_metrics=on_metrics, on_scale=said.append)
    while not first.is_set() and not handle.done():
        first.wait(0.01)
    took = time.perf_counter() - t0
    return took, said, handle.wait(300)


def _until(condition: Any, timeout: float) -> float | None:
    """Seconds until ``condition()`` holds (None: it did not within ``timeout``)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if condition():
            return time.perf_counter() - t0
        time.sleep(0.05)
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_grow", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="CSV of pet names (default: the packaged snapshot)")
    ap.add_argument("--repeats", type=int, default=None, help="rounds of (grown, ready) launches (default 3)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--quick", action="store_true", help="one round of tiny runs (smoke test): not a measurement")
    args = ap.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    data = resolve_data(args.data)

    import tempfile

    from petmodel.cluster.connect import shutdown
    from petmodel.cluster.local import local_scaler, start_local_cluster
    from petmodel.cluster.workers import describe_workers
    from petmodel.config import RunSpec, ScalingConfig, TrainConfig
    from petmodel.data import load_corpus
    from petmodel.store import RunStore

    corpus = load_corpus(data)
    spec = RunSpec(hidden=32, layers=1, data=data, workers=2, name="bench-grow",
                   train=TrainConfig(max_steps=20 if args.quick else 40, max_seconds=None, batch_size=64))
    client = start_local_cluster(1, 1)
    scaler = local_scaler(client, ScalingConfig(max_workers=2, grace_s=GRACE_S), floor=1)
    count = lambda: len(describe_workers(client, probe_gpus=False))  # noqa: E731
    rounds: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="petmodel-bench-grow-") as tmp:
            store = RunStore(tmp)
            if not args.quick:  # warm-up: a fresh cluster's one-off costs (grows it once)
                _first_step(client, spec, store, corpus)
                _until(lambda: count() == 1, 60)
            for r in range(repeats):
                grown_s, said, grown = _first_step(client, spec, store, corpus)  # 1 worker: the launch grows it
                ready_s, _, ready = _first_step(client, spec, store, corpus)  # 2 workers, already there
                release_s = _until(lambda: count() == 1, 60)
                rounds.append({"grown_s": grown_s, "ready_s": ready_s, "release_s": release_s, "said": said,
                               "status": [grown.get("status"), ready.get("status")]})
                print(f"  round {r + 1}: grown {grown_s:.2f} s, ready {ready_s:.2f} s, released after "
                      f"{fmt(release_s)} s", file=sys.stderr, flush=True)
    finally:
        scaler.close()
        shutdown(client)

    med = {k: statistics.median(x[k] for x in rounds if x[k] is not None) if rounds else None
           for k in ("grown_s", "ready_s", "release_s")}
    print(table(["cluster at launch", "launch → first step (median s)", "rounds"],
                [["1 worker, grown to 2 by the launch", fmt(med["grown_s"]), len(rounds)],
                 ["2 workers ready", fmt(med["ready_s"]), len(rounds)]],
                title=f"2-worker launch on the embedded cluster, load avg {load_avg()}"))
    if med["grown_s"] is not None and med["ready_s"] is not None:
        print(f"\ngrowing costs {med['grown_s'] - med['ready_s']:.2f} s; the added worker went "
              f"{fmt(med['release_s'])} s after the run (grace {GRACE_S:g} s)")
    if args.quick:
        print("(--quick: tiny runs; not a measurement)")
    result = {"benchmark": "grow", "quick": args.quick, "repeats": repeats, **machine_info(), **med, "rounds": rounds}
    if args.json:
        print_json(result)
    return result


if __name__ == "__main__":
    main()
