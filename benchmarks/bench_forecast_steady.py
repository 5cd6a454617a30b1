"""Is the forecast as steady and as right as what it predicts? The same sweep, back to back, forecast vs median.

    python -m benchmarks.bench_forecast_steady [--sweeps 3] [--repeats 3] [--seconds 40] [--json] [--quick]

Runs ``python -m petmodel sweep --workers 1,2 --equivalent --global-batch 512 --target-nll 2.6 --repeats K
--json`` (issue 51's sweep) ``--sweeps`` times back to back, each on its own embedded cluster as a user runs
it, and prints for every multi-worker setting of every sweep: the forecast speedup with its range, the measured
median speedup with its range (K interleaved repeats), the error |forecast − median| ÷ median, and whether the
forecast's range held the median. Then the forecasts' spread across the sweeps (steadiness), and, to find what
a forecast gets wrong, each step part the calibration forecast beside the same part the runs measured (their
step-time windows, the loop's own breakdown): per-step milliseconds, forecast vs measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import fmt, load_avg, machine_info, print_json, table

SWEEP = {"workers": "1,2", "global_batch": "512", "target_nll": 2.6, "seconds": 40.0}
QUICK = {"workers": "1,2", "global_batch": "64", "target_nll": 3.0, "seconds": 3.0, "model": ["--embed", "8",
                                                                                              "--hidden", "16"]}
PARTS = ("compute_s", "allreduce_s", "idle_s", "data_s", "optimizer_s", "agree_s", "report_s")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_sweep(o: dict[str, Any], repeats: int, store: Path) -> dict[str, Any]:
    """One ``sweep … --json`` in this process, on its own embedded cluster: its JSON object."""
    from benchmarks.bench_forecast import sweep

    return sweep(["--workers", o["workers"], "--equivalent", "--global-batch", o["global_batch"], "--target-nll",
                  str(o["target_nll"]), "--max-seconds", str(o["seconds"]), "--repeats", str(repeats),
                  "--store", str(store), *o.get("model", [])])


def measured_parts(store: Path, run_ids: list[str]) -> dict[str, float]:
    """The runs' typical step, every part averaged over the runs (seconds per step)."""
    from petmodel.step_breakdown import step_time_summary
    from petmodel.store import RunStore

    windows = RunStore(store).step_time_rows(run_ids)
    summaries = [s for rid in run_ids if (s := step_time_summary(windows.get(rid, [])))]
    return {k: statistics.mean(s.get(k) or 0.0 for s in summaries) for k in ("step_s", *PARTS)} if summaries else {}


def forecast_parts(store: Path, study_id: str, workers: int) -> dict[str, float]:
    """The forecast step of ``workers`` as the sweep's calibration made it (kept in the study's row)."""
    from petmodel.store import RunStore

    study = RunStore(store).get_study(study_id)
    forecast = ((study.result if study is not None else None) or {}).get("forecast") or {}
    rows = [r for r in forecast.get("rows", []) if r["workers"] == workers]
    if not rows:
        return {}
    parts = dict(rows[0]["parts"])
    return {"step_s": rows[0]["step_s"], **parts}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweeps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--quick", action="store_true", help="a tiny model, 2 sweeps of 1 repeat: that it works")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    o = dict(QUICK if a.quick else SWEEP)
    if a.seconds:
        o["seconds"] = a.seconds
    sweeps, repeats = (2, 1) if a.quick else (a.sweeps, a.repeats)
    rows: list[dict[str, Any]] = []
    parts_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(sweeps):
            store = Path(tmp) / f"store{i}"
            log(f"sweep {i + 1}/{sweeps}: workers {o['workers']} at global batch {o['global_batch']}, "
                f"{repeats} repeats of {o['seconds']:g} s…")
            result = run_sweep(o, repeats, store)
            for s in result["summary"]:
                if s["workers"] > 1:
                    err = (abs(s["forecast_speedup"] - s["speedup_median"]) / s["speedup_median"]
                           if s["forecast_speedup"] is not None and s["speedup_median"] else None)
                    rows.append({"sweep": i + 1, "workers": s["workers"], "global_batch": s["global_batch"],
                                 "forecast": s["forecast_speedup"], "forecast_low": s["forecast_low"],
                                 "forecast_high": s["forecast_high"], "median": s["speedup_median"],
                                 "low": s["speedup_low"], "high": s["speedup_high"], "error": err,
                                 "signed_error": (s["forecast_speedup"] / s["speedup_median"] - 1
                                                  if err is not None else None),
                                 "held": s["forecast_held"], "runs": s["runs"]})
                for_parts = forecast_parts(store, result["study_id"], s["workers"])
                got = measured_parts(store, s["run_ids"])
                for key in ("step_s", *PARTS):
                    parts_rows.append({"sweep": i + 1, "workers": s["workers"], "part": key,
                                       "forecast_ms": 1e3 * for_parts[key] if key in for_parts else None,
                                       "measured_ms": 1e3 * got[key] if key in got else None})
    forecasts = [r["forecast"] for r in rows if r["forecast"] is not None]
    steady = (max(abs(f / statistics.mean(forecasts) - 1) for f in forecasts) if forecasts else None)
    errors = [r["error"] for r in rows if r["error"] is not None]
    out = {"benchmark": "forecast_steady", "quick": a.quick, "sweep": o, "sweeps": sweeps, "repeats": repeats,
           "rows": rows, "parts": parts_rows, "forecast_spread": steady,
           "max_error": max(errors) if errors else None,
           "held": sum(bool(r["held"]) for r in rows), "machine": machine_info(), "load_avg": load_avg()}
    cols = ["sweep", "workers", "forecast", "forecast_low", "forecast_high", "median", "low", "high", "signed_error",
            "held", "runs"]
    print(table(cols, [[r[c] for c in cols] for r in rows], "Speedup: forecast vs measured median"))
    print(f"Forecasts within ±{fmt(steady)} of their mean; largest error {fmt(out['max_error'])}; "
          f"{out['held']} of {len(rows)} ranges held the measured median.")
    cols = ["sweep", "workers", "part", "forecast_ms", "measured_ms"]
    print(table(cols, [[r[c] for c in cols] for r in parts_rows], "Per step, forecast vs measured (ms)"))
    if a.json:
        print_json(out)
    return out


if __name__ == "__main__":
    main()
