"""The speedup forecast checked against measurement: equivalent sweeps here and across simulated hosts.

    python -m benchmarks.bench_forecast [--workers 1,2,3,4] [--global-batch 240,960] [--seconds 40]
                                        [--rates none,1gbit,200mbit] [--no-hosts] [--no-local] [--busy]
                                        [--json] [--quick]

Each sweep is ``python -m petmodel sweep --equivalent … --json`` run as a user runs it: it
calibrates for a few seconds, records each row's ``forecast_speedup``, then trains every row and
measures its speedup (time to the target NLL of 1 worker ÷ that of N, the same global batch). The
table puts the two side by side with the forecast's error, |forecast − measured| ÷ measured.

1. **This machine**: the embedded local cluster, ``--workers`` at each ``--global-batch``.
2. **Simulated hosts** (root only; ``--no-hosts`` skips): the scheduler and two workers in network
   namespaces (:mod:`benchmarks.simulated_hosts`), the workers' links limited by a ``tc`` token
   bucket at each of ``--rates``; 1 and 2 workers at the first global batch.

``--busy`` keeps one core busy with another process throughout (the calibration runs beside it and sees it).
Then, with no cluster, the write-up's grid (1/4/16 workers × global batch 1024/4096/16384) forecast
for a GPU cluster from the stated assumptions in :data:`GPU_ASSUMPTIONS` (no GPU has been measured
here; ``benchmarks.bench_gpu`` measures the figures they stand for).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Iterator
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import fmt, load_avg, machine_info, print_json, table

QUICK = {"workers": "1,2", "global_batch": "64", "seconds": 4.0, "hidden": 32, "embed": 8, "target_nll": 3.0}
# Global batches every worker count (1–4) divides. The target is one a single worker needs several
# seconds for: a time to target of ~1 s is a handful of steps and validations, its ratio mostly noise.
DEFAULTS = {"workers": "1,2,3,4", "global_batch": "240,960", "seconds": 40.0, "hidden": 128, "embed": 32,
            "target_nll": 2.55}

# A GPU cluster nobody here has measured: one GPU per worker, the default model (embed 32, hidden 256,
# one layer) in fp32. Compute per step from its per-name cost and a fixed launch cost per step, both
# typical of one LSTM step on an H100-class GPU at these batches; workers on different hosts joined by
# 100 Gbit/s links (12.5 GB/s at best, NCCL's ring at about 80% of it) with 30 µs per hop.
GPU_ASSUMPTIONS = {
    "compute_per_name_s": 3.0e-7, "compute_fixed_s": 2.0e-3, "data_s": 2.0e-4, "optimizer_s": 3.0e-4,
    "bandwidth_bytes_per_s": 10.0e9, "latency_s": 30e-6, "jitter": 0.05,
}
GPU_GRID = {"workers": (1, 4, 16), "global_batch": (1024, 4096, 16384), "lr": 0.016}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sweep(args: list[str]) -> dict[str, Any]:
    """``python -m petmodel sweep <args> --json`` in this process: its JSON object (raises on a failed exit)."""
    from petmodel.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["sweep", *args, "--json"])
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    if code != 0 or not lines:
        raise RuntimeError(f"sweep {' '.join(args)} exited {code}: {out.getvalue()[-2000:]}")
    return json.loads(lines[-1])


def compare(result: dict[str, Any], setting: str) -> list[dict[str, Any]]:
    """One row per multi-worker run of a sweep: its forecast and measured speedups and the error."""
    from petmodel.studies.forecast import speedup_error

    rows = []
    one = {r["global_batch"]: r.get("time_to_target") for r in result["rows"] if r["workers"] == 1}
    for r in result["rows"]:
        if r["workers"] <= 1:
            continue
        err = speedup_error(r.get("forecast_speedup"), r.get("speedup"))
        rows.append({"setting": setting, "workers": r["workers"], "global_batch": r["global_batch"],
                     "forecast_speedup": r.get("forecast_speedup"), "measured_speedup": r.get("speedup"),
                     "error": err, "time_to_target": r.get("time_to_target"),
                     "one_worker_time_to_target": one.get(r["global_batch"]), "status": r["status"]})
    return rows


def model_args(o: dict[str, Any]) -> list[str]:
    return ["--max-seconds", str(o["seconds"]), "--embed", str(o["embed"]), "--hidden", str(o["hidden"]),
            "--dropout", "0", "--target-nll", str(o["target_nll"]), "--lr", "0.016"]


def on_this_machine(o: dict[str, Any], store: Path) -> list[dict[str, Any]]:
    """The sweeps on one local cluster of the largest worker count, started here and named to the sweep.

    A sweep's own embedded cluster stops at one worker per core; 3 and 4 workers on 2 cores share them,
    which the calibration (all ranks at once) sees too, so the forecast has to predict the sharing.
    """
    from petmodel.cluster.connect import shutdown
    from petmodel.cluster.local import start_local_cluster
    from petmodel.cluster.tuning import TIMING_CLUSTER_CONFIG

    rows = []
    client = start_local_cluster(max(int(n) for n in o["workers"].split(",")), 1, config=TIMING_CLUSTER_CONFIG)
    try:
        for batch in o["global_batch"].split(","):
            log(f"this machine: workers {o['workers']} at global batch {batch}…")
            result = sweep(["--scheduler", client.scheduler.address, "--workers", o["workers"], "--global-batch",
                            batch, "--equivalent", "--store", str(store), *model_args(o)])
            rows += compare(result, "this machine (local cluster)")
    finally:
        shutdown(client)
    return rows


def across_hosts(o: dict[str, Any], store: Path, rates: list[str]) -> list[dict[str, Any]]:
    from benchmarks.simulated_hosts import WORKER_HOSTS, simulated_cluster

    rows = []
    batch = o["global_batch"].split(",")[0]
    with tempfile.TemporaryDirectory() as root, simulated_cluster(Path(root)) as hosts:
        for rate in rates:
            limit = None if rate == "none" else rate
            for host in WORKER_HOSTS:
                hosts.throttle(host, limit)
            log(f"simulated hosts, links {rate}: workers 1,2 at global batch {batch}…")
            result = sweep(["--scheduler", hosts.scheduler, "--workers", "1,2", "--global-batch", batch, "--equivalent",
                            "--store", str(store), *model_args(o)])
            rows += compare(result, f"2 simulated hosts, links {'unlimited' if limit is None else limit}")
    return rows


def default_grad_bytes() -> int:
    """The default model's gradient (fp32), what every step all-reduces."""
    from petmodel.config import RunSpec
    from petmodel.data import Alphabet
    from petmodel.model import CharLSTM

    model = CharLSTM(RunSpec().model_config(Alphabet().vocab_size).for_data(False))
    return 4 * sum(p.numel() for p in model.parameters())


def gpu_grid() -> dict[str, Any]:
    """The write-up's grid forecast for a GPU cluster from :data:`GPU_ASSUMPTIONS` (no cluster)."""
    from types import SimpleNamespace

    from petmodel.studies.forecast import AllreduceTiming, Calibration, PointTiming, forecast_rows

    a = {**GPU_ASSUMPTIONS, "grad_bytes": default_grad_bytes()}
    points, allreduces = [], []
    for n in GPU_GRID["workers"]:
        for b in sorted({g // n for g in GPU_GRID["global_batch"]}):
            compute = a["compute_fixed_s"] + a["compute_per_name_s"] * b
            points.append(PointTiming(workers=n, batch_per_worker=b, compute_s=compute, data_s=a["data_s"],
                                      optimizer_s=a["optimizer_s"], idle_s=a["jitter"] * compute if n > 1 else 0.0,
                                      low_s=compute, high_s=compute * (1 + 2 * a["jitter"])))
        if n > 1:
            s = 2 * (n - 1) / n * a["grad_bytes"] / a["bandwidth_bytes_per_s"] + 2 * (n - 1) * a["latency_s"]
            allreduces.append(AllreduceTiming(workers=n, nbytes=a["grad_bytes"], seconds=s, low_s=s * 0.8,
                                              high_s=s * 1.5))
    calibration = Calibration(points=tuple(points), allreduces=tuple(allreduces), grad_bytes=a["grad_bytes"],
                              source="assumed: " + ", ".join(f"{k} {v}" for k, v in a.items()))
    planned = [SimpleNamespace(index=i, workers=n, global_batch=g, batch_per_worker=g // n, lr=GPU_GRID["lr"])
               for i, (g, n) in enumerate((g, n) for g in GPU_GRID["global_batch"] for n in GPU_GRID["workers"])]
    rows = forecast_rows(planned, calibration, equivalent=True)
    return {"assumptions": dict(a), "rows": [{"workers": r.workers, "global_batch": r.global_batch,
                                              "step_s": r.step_s, "forecast_speedup": r.speedup,
                                              "speedup_low": r.speedup_low, "speedup_high": r.speedup_high,
                                              "efficiency": r.speedup / r.workers if r.speedup else None}
                                             for r in rows]}


@contextlib.contextmanager
def busy_core(on: bool) -> Iterator[None]:
    """With ``on``: another process spinning on one core for as long as the block lasts (killed after)."""
    if not on:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    log(f"another process (pid {spinner.pid}) keeps a core busy")
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", help=f"worker counts on this machine (default {DEFAULTS['workers']})")
    ap.add_argument("--global-batch", help=f"global batches, comma-separated (default {DEFAULTS['global_batch']})")
    ap.add_argument("--seconds", type=float, help=f"training budget per run (default {DEFAULTS['seconds']:g})")
    ap.add_argument("--rates", default="none,1gbit,200mbit",
                    help="link limits for the simulated hosts, tc units, 'none' for unlimited (default %(default)s)")
    ap.add_argument("--no-hosts", action="store_true", help="skip the simulated hosts (they need root)")
    ap.add_argument("--no-local", action="store_true", help="skip the sweeps on this machine's local cluster")
    ap.add_argument("--busy", action="store_true",
                    help="keep one core busy with another process throughout (as other work on a shared cluster)")
    ap.add_argument("--quick", action="store_true", help="tiny budgets, no simulated hosts (smoke test): not a measurement")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    o = dict(QUICK if args.quick else DEFAULTS)
    for key in ("workers", "global_batch", "seconds"):
        if getattr(args, key) is not None:
            o[key] = getattr(args, key)

    rows: list[dict[str, Any]] = []
    hosts_note = None
    with tempfile.TemporaryDirectory() as store, busy_core(args.busy):
        if not args.no_local:
            rows += on_this_machine(o, Path(store))
        if not (args.quick or args.no_hosts):
            try:
                rows += across_hosts(o, Path(store), args.rates.split(","))
            except RuntimeError as err:
                hosts_note = str(err)
                log(f"skipping the simulated hosts: {err}")
    grid = gpu_grid()

    print(table(["setting", "workers", "global batch", "forecast", "measured", "error", "time to target (1 / N)"],
                [[r["setting"], r["workers"], r["global_batch"], r["forecast_speedup"], r["measured_speedup"],
                  "–" if r["error"] is None else f"{100 * r['error']:.0f}%",
                  f"{fmt(r['one_worker_time_to_target'], 1)} / {fmt(r['time_to_target'], 1)} s"] for r in rows],
                title="Speedup over 1 worker, equivalent runs (same global batch): forecast before training vs measured"))
    if hosts_note:
        print(f"(simulated hosts skipped: {hosts_note})")
    print()
    print(table(["workers", "global batch", "step (ms)", "forecast speedup", "range", "efficiency"],
                [[r["workers"], r["global_batch"], 1000 * r["step_s"], r["forecast_speedup"],
                  f"{fmt(r['speedup_low'])}–{fmt(r['speedup_high'])}", r["efficiency"]] for r in grid["rows"]],
                title="The write-up's grid on a GPU cluster, forecast from stated assumptions (not measured)"))
    print("assumptions: " + ", ".join(f"{k} = {v:g}" for k, v in grid["assumptions"].items()))
    if args.quick:
        print("(--quick: tiny budgets; not a measurement)")
    result = {"machine": machine_info(), "load_avg": load_avg(), "settings": o, "busy": args.busy, "rows": rows,
              "gpu_grid": grid,
              "hosts_skipped": hosts_note}
    if args.json:
        print_json(result)
    return result


if __name__ == "__main__":
    main()
