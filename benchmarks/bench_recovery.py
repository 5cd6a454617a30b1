"""What surviving faults costs: periodic snapshots' slowdown, and the training time lost to a killed worker.

1. Slowdown: the same 2-worker DDP run (default model) with snapshots only at the end (twice: the
   noise), at the default interval, and 10× more often; each run is compared with the end-only run of
   its round (paired ratios resist a shared machine's drift). Also the cost of one snapshot on rank 0's
   training thread (copy to the CPU) and in the background (serialise).
2. Loss: a 2-worker run whose rank-1 worker is killed mid-run (SIGKILL). Lost time is the wall time
   from the kill until the re-formed run is back at the step it had reached, split into detection,
   re-forming the group and re-training the steps since the last snapshot.

    python -m benchmarks.bench_recovery [--quick] [--json]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from typing import Any

from benchmarks._common import load_avg, machine_info, print_json, resolve_data, table


def snapshot_cost(spec: Any, corpus: Any, repeats: int) -> dict[str, float]:
    """Milliseconds to copy the training state to the CPU (weights and Adam moments, on the training
    thread) and to serialise the whole snapshot (in the background), median of ``repeats``."""
    from petmodel.train import cpu_copy, train_model

    captured: list[Any] = []
    few_steps = replace(spec.train, max_seconds=None, max_steps=3, checkpoint_every_s=1e-9)
    train_data, val_data = corpus.encode_splits()
    train_model(spec.model_config(corpus.alphabet.vocab_size), few_steps, train_data, val_data,
                on_checkpoint=captured.append)
    state = captured[-1]

    def median_ms(work: Any) -> float:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            work()
            times.append((time.perf_counter() - t) * 1000)
        return statistics.median(times)

    return {"copy_ms": median_ms(lambda: cpu_copy({"model": state.model, "optimizer": state.optimizer})),
            "serialise_ms": median_ms(state.to_bytes), "bytes": len(state.to_bytes()),
            "params": sum(v.numel() for v in state.model.values())}


def slowdown(client: Any, spec: Any, corpus: Any, settings: dict[str, float], seconds: float, rounds: int,
             store: Any, warm_up: bool = True) -> dict[str, dict[str, float]]:
    """Samples/s of the same run under each setting (label → snapshot interval, 0: only at the end).

    Each round runs every setting once, in a rotated order, and each is compared with the round's
    "end only" run: adjacent runs share the machine's state, so the median of these paired ratios
    resists the drift of a shared machine. An identical "end only (again)" setting measures the noise.
    """
    from petmodel.cluster.launch import launch_run

    labels = list(settings)
    rates: dict[str, list[float]] = {k: [] for k in labels}
    if warm_up:  # the first run on a fresh cluster pays one-off costs (imports, gloo's first connection)
        launch_run(client, spec.with_(workers=2, max_seconds=min(2.0, seconds)), store, corpus=corpus).wait(120)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            run_spec = spec.with_(workers=2, max_seconds=seconds, checkpoint_every_s=settings[label])
            result = launch_run(client, run_spec, store, corpus=corpus).wait(seconds * 4 + 60)
            rates[label].append(result["samples_per_s"])
    base = rates[labels[0]]
    out = {}
    for label in labels:
        ratios = [x / b for x, b in zip(rates[label], base)]
        out[label] = {"samples_per_s": statistics.median(rates[label]), "ratio": statistics.median(ratios),
                      "ratio_min": min(ratios), "ratio_max": max(ratios)}
    return out


def lost_time(client: Any, spec: Any, corpus: Any, store: Any, kill_after_s: float, steps: int,
              kill_at_step: int = 3) -> dict[str, Any]:
    """Kill rank 1's worker ``kill_after_s`` after rank 0 reports step ``kill_at_step``; how long until the run
    is back where it was. Waiting for a step, not only a time, keeps the kill mid-run on a machine whose speed
    changed since the rate that sized the run was measured."""
    from petmodel.cluster.launch import launch_run
    from petmodel.cluster.workers import describe_workers

    seen: list[tuple[float, int]] = []  # (wall clock, step) as rows reach the client
    lock = threading.Lock()

    def on_metrics(row: dict[str, Any]) -> None:
        if row.get("kind") == "train" and row.get("rank") == 0:
            with lock:
                seen.append((time.monotonic(), int(row["step"])))

    pids = {w.address: w.pid for w in describe_workers(client)}
    run_spec = spec.with_(workers=2, max_seconds=None, max_steps=steps)
    handle = launch_run(client, run_spec, store, corpus=corpus, on_metrics=on_metrics)
    while (not seen or seen[-1][1] < kill_at_step) and not handle.done():  # the rendezvous takes longer when loaded
        time.sleep(0.05)
    time.sleep(kill_after_s)
    with lock:
        step_at_kill = seen[-1][1]
    victim = handle.worker_addresses[1]
    killed_at = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    result = handle.wait(600)
    run = store.get_run(handle.run_id)
    lost = run.lost_workers[0] if run.lost_workers else {}
    resumed_step = lost.get("step", 0)
    with lock:
        after = [(t, s) for t, s in seen if t > killed_at]
    first_new = next((t for t, s in after if s == resumed_step + 1), None)
    back = next((t for t, s in after if s >= step_at_kill and t >= (first_new or 0)), None)
    detected = lost.get("at")
    detect_s = (detected - (time.time() - (time.monotonic() - killed_at))) if detected else None
    return {"status": result.get("status"), "restarts": run.restarts, "step_at_kill": step_at_kill,
            "resumed_from_step": resumed_step, "workers_after": len(run.workers),
            "lost_s": (back - killed_at) if back else None, "detect_s": detect_s,
            "reform_s": (first_new - killed_at - detect_s) if first_new and detect_s is not None else None,
            "retrain_s": (back - first_new) if back and first_new else None, "val_nll": result.get("val_nll")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_recovery", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks the script, not a measurement")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line at the end")
    parser.add_argument("--data", help="data file (default: what petmodel trains on by default)")
    args = parser.parse_args(argv)

    from petmodel.config import DEFAULT_SPEC
    from petmodel.data import load_corpus
    from petmodel.cluster.connect import shutdown
    from petmodel.cluster.local import start_local_cluster
    from petmodel.store import RunStore

    corpus = load_corpus(resolve_data(args.data))
    spec = DEFAULT_SPEC.with_(hidden=32) if args.quick else DEFAULT_SPEC
    default = DEFAULT_SPEC.train.checkpoint_every_s
    settings = {"end only": 0.0, "end only (again)": 0.0, f"every {default:g} s": default,
                f"every {default / 10:g} s": default / 10}
    if args.quick:
        settings = {"end only": 0.0, f"every {default:g} s": default}
    store = RunStore(tempfile.mkdtemp(prefix="bench-recovery-"))
    cost = snapshot_cost(spec, corpus, repeats=3 if args.quick else 20)
    load_start = load_avg()
    client = start_local_cluster(2, 1)
    try:
        rates = slowdown(client, spec, corpus, settings, seconds=0.5 if args.quick else 12,
                         rounds=1 if args.quick else 5, store=store, warm_up=not args.quick)
        # Long enough that the kill lands mid-run and the re-formed run has work left after it.
        # (At least 150 steps: a 1 s rate measured on a busy machine can be a fraction of the later one.)
        steps = int(rates["end only"]["samples_per_s"] * (3 if args.quick else 30) / (2 * spec.train.batch_size))
        steps = max(steps, 150)
        # Quick: the kill lands a quarter of the way in, whatever the machine's speed is by then.
        loss = lost_time(client, spec, corpus, store, kill_after_s=0.0 if args.quick else default + 2.5, steps=steps,
                         kill_at_step=steps // 4 if args.quick else 3)
    finally:
        shutdown(client)
    rows = [[label, r["samples_per_s"], r["ratio"], f"{r['ratio_min']:.3f}–{r['ratio_max']:.3f}"]
            for label, r in rates.items()]
    print(table(["snapshots", "samples/s", "vs end only", "range over rounds"], rows,
                title="Periodic snapshots, 2 workers × 1 thread (medians of paired ratios: each run against the "
                      "end-only run of its round)"))
    print(f"\nOne snapshot: {cost['bytes'] / 1e6:.1f} MB; copy of weights and Adam moments on the training thread {cost['copy_ms']:.2f} ms, "
          f"serialise in the background {cost['serialise_ms']:.1f} ms.")
    print("\n" + table(["lost s", "detect s", "re-form s", "re-train s", "step at kill", "resumed from",
                        "workers after", "restarts"],
                       [[loss["lost_s"], loss["detect_s"], loss["reform_s"], loss["retrain_s"], loss["step_at_kill"],
                         loss["resumed_from_step"], loss["workers_after"], loss["restarts"]]],
                       title=f"A worker killed mid-run (snapshots every {default:g} s)"))
    if args.json:
        print_json({"benchmark": "recovery", "quick": args.quick, "machine": machine_info(), "load_avg_start": load_start,
                    "snapshots": rates, "snapshot": cost, "loss": loss})
    return 0


if __name__ == "__main__":
    sys.exit(main())
