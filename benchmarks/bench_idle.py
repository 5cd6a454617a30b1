"""What an idle embedded cluster costs: CPU of its scheduler, nannies and workers while no task runs.

    python -m benchmarks.bench_idle [--workers 2] [--seconds 15] [--rounds 2] [--json]

The app keeps its embedded cluster (a ``LocalCluster`` of worker processes) for as long as it runs,
mostly idle, and the test suite keeps one per test process. Each round starts the cluster twice, as
:func:`petmodel.cluster.local.start_local_cluster` does (500 ms event-loop tick) and with Dask's 20 ms
default tick, waits for it to settle, then counts the CPU seconds of this process (the scheduler)
and its children (nannies, workers, the fork server) over ``--seconds``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks._common import cpu_snapshot, load_avg, machine_info, print_json, table

SETTLE_S = 3.0  # after the start: the workers' imports and first heartbeats are not idling
SETTINGS = {"petmodel (500 ms tick)": {}, "Dask's default (20 ms tick)": {"distributed.admin.tick.interval": "20ms"}}


def idle_share(workers: int, seconds: float, config: dict[str, Any]) -> float:
    """Share of one core that an idle cluster of ``workers`` × 1 thread takes, started with ``config``."""
    from petmodel.cluster.connect import shutdown
    from petmodel.cluster.local import start_local_cluster

    client = start_local_cluster(workers, 1, dashboard_address=None, config=config)
    try:
        time.sleep(SETTLE_S)
        before = cpu_snapshot()
        time.sleep(seconds)
        after = cpu_snapshot()
        if before is None or after is None:
            raise SystemExit("bench_idle reads /proc (Linux only).")
        return (after["ours"] - before["ours"]) / (after["t"] - before["t"])
    finally:
        shutdown(client)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_idle", description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="workers of the embedded cluster (default 2)")
    ap.add_argument("--seconds", type=float, default=15.0, help="idle seconds measured per cluster (default 15)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of both settings, alternating (default 2)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)

    load_start = load_avg()
    shares: dict[str, list[float]] = {label: [] for label in SETTINGS}
    for r in range(args.rounds):
        labels = list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]
        for label in labels:
            shares[label].append(idle_share(args.workers, args.seconds, SETTINGS[label]))
    med = {label: statistics.median(values) for label, values in shares.items()}
    ours, dask_default = med.values()
    print(table(["cluster", "idle CPU (% of a core, median)", "rounds"],
                [[label, f"{100 * share:.1f}", len(shares[label])] for label, share in med.items()],
                title=f"An idle embedded cluster of {args.workers} workers × 1 thread, {args.seconds:g} s each, "
                      f"load avg {load_start}"))
    print(f"\nDask's default tick costs {dask_default / ours:.1f}× the idle CPU of petmodel's setting")
    if args.json:
        print_json({"benchmark": "idle", "workers": args.workers, "seconds": args.seconds, "rounds": args.rounds,
                    "machine": machine_info(), "load_avg_start": load_start, "idle_share": med, "all": shares,
                    "ratio_default_over_ours": dask_default / ours})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
