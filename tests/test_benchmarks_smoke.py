"""Smoke test: the benchmark scripts run end to end with ``--quick --json`` (tiny budgets).

Not a measurement: it only checks that the scripts work and report sane, complete figures.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # each runs a benchmark end to end once; deselect with -m "not slow"


def _run(module: str, timeout: float) -> dict:
    # No --data: the benchmarks must work on a fresh clone with the packaged snapshot.
    proc = subprocess.run([sys.executable, "-m", module, "--quick", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{module} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"{module} printed nothing"
    assert "\n" in proc.stdout and "---" in proc.stdout, "expected a printed table before the JSON"
    return json.loads(lines[-1])


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_bench_core_quick():
    out = _run("benchmarks.bench_core", timeout=240)  # 51 s in a full-suite run; a hang bound, not a speed one
    assert out["benchmark"] == "core" and out["quick"] is True
    assert out["torch_threads"] == 2
    for key in ("ours", "baseline", "runs", "generation", "ratio_baseline_over_ours", "ratio_kind", "target_nll",
                "load_avg_start", "val_pred_chars"):
        assert key in out, key
    for run in (out["ours"], out["baseline"]):
        for key in ("time_to_target_s", "best_val_nll", "train_seconds", "samples_per_s", "evals", "reached"):
            assert key in run, key
        assert _positive(run["train_seconds"]) and _positive(run["samples_per_s"])
        assert run["evals"] >= 1 and 0 < run["best_val_nll"] < 10
        if run["reached"]:
            assert _positive(run["time_to_target_s"])
        else:
            assert _positive(run["time_to_target_lower_bound_s"])
    assert out["baseline"]["val_windows"] == out["val_pred_chars"]  # same scored characters
    assert out["ours"]["reached"], "the quick target should be reached by the default training"
    assert _positive(out["ratio_baseline_over_ours"])
    from petmodel.precision import bf16_supported

    assert out["bf16_cpu"] == bf16_supported("cpu")  # a bf16 row only where this CPU runs bf16
    assert any(r["precision"] == "bf16" for r in out["runs"]) == out["bf16_cpu"]
    gen = out["generation"][0]
    assert _positive(gen["best_s"]) and _positive(gen["names_per_s"]) and gen["returned"] == gen["n"]


def test_bench_ddp_quick():
    out = _run("benchmarks.bench_ddp", timeout=240)  # 35 s in a full-suite run; a hang bound, not a speed one
    assert out["benchmark"] == "ddp" and out["quick"] is True
    by_workers = {r["workers"]: r for r in out["results"]}
    assert set(by_workers) == {1, 2}
    for r in out["results"]:
        assert r["backend"] == "gloo" or out["cuda"]
        assert _positive(r["samples_per_s"]) and _positive(r["train_seconds"]) and r["steps"] >= 1
    assert by_workers[2]["global_batch"] == 2 * by_workers[1]["global_batch"]
    assert _positive(out["ratio_2w_over_1w"])
    assert all(f["torch_threads"] == 1 for f in out["worker_facts"])


def test_bench_recovery_quick():
    out = _run("benchmarks.bench_recovery", timeout=240)
    assert out["benchmark"] == "recovery" and out["quick"] is True
    assert set(out["snapshots"]) == {"end only", "every 5 s"}
    assert all(_positive(r["samples_per_s"]) and _positive(r["ratio"]) for r in out["snapshots"].values())
    assert out["snapshot"]["bytes"] > 4 * 4 * out["snapshot"]["params"]  # fp32 weights, 2 Adam moments, best weights
    assert _positive(out["snapshot"]["copy_ms"]) and _positive(out["snapshot"]["serialise_ms"])
    loss = out["loss"]
    assert loss["status"] == "completed" and loss["restarts"] == 1, loss  # the kill landed mid-run and was survived
    assert _positive(loss["lost_s"]) and loss["lost_s"] < 60 and _positive(loss["retrain_s"])


def test_bench_plan_quick():
    out = _run("benchmarks.bench_plan", timeout=240)  # about 40 s alone; a hang bound, not a speed one
    assert out["benchmark"] == "plan" and out["quick"] is True
    grid = [c for c in out["cells"] if c["kind"] == "grid"]
    assert len(grid) == 6 and {c["workers"] for c in grid} == {1, 2} and len({c["global_batch"] for c in grid}) == 3
    assert [c["kind"] for c in out["cells"]].count("write-up recipe") == 1
    assert all(_positive(c["forecast_s"]) and c["forecast_low_s"] <= c["forecast_s"] <= c["forecast_high_s"]
               for c in grid)
    rec = out["recommended"]
    assert any(c["workers"] == rec["workers"] and c["global_batch"] == rec["global_batch"] for c in grid)
    assert out["regret"] is None or out["regret"] >= 0  # measured ÷ best − 1
    assert out["rank_correlation"] is None or -1 <= out["rank_correlation"] <= 1
    assert _positive(out["plan_wall_s"]) and out["plan_seconds"] <= out["plan_wall_s"]


def test_bench_busy_quick():
    out = _run("benchmarks.bench_busy", timeout=240)  # two 3 s trainings and their start-up; a hang bound
    assert out["benchmark"] == "busy" and out["quick"] is True and out["busy_processes"] == 1
    assert [r["busy"] for r in out["runs"]] == [False, True]  # one pair, quiet first
    for run in out["runs"]:
        assert _positive(run["samples_per_s"]) and run["steps"] >= 1
        assert isinstance(run["torch_threads"], int) and run["torch_threads"] >= 1  # train --json says its choice
    for key in ("quiet", "busy", "ratio"):
        assert out[key]["min"] <= out[key]["median"] <= out[key]["max"] and _positive(out[key]["median"])
    assert out["ratio"]["median"] == pytest.approx(out["busy"]["median"] / out["quiet"]["median"])  # one pair
    assert out["target_met"] == (out["ratio"]["median"] >= out["target_ratio"])


def test_bench_forecast_steady_quick():
    out = _run("benchmarks.bench_forecast_steady", timeout=300)  # two tiny sweeps on their own clusters
    assert out["benchmark"] == "forecast_steady" and out["sweeps"] == 2 and out["repeats"] == 1
    assert [r["sweep"] for r in out["rows"]] == [1, 2] and all(r["workers"] == 2 for r in out["rows"])
    for r in out["rows"]:
        assert r["runs"] == 1 and (r["median"] is None or r["low"] <= r["median"] <= r["high"])
        assert r["forecast"] is None or r["forecast_low"] <= r["forecast"] <= r["forecast_high"]
    parts = {(p["sweep"], p["workers"], p["part"]): p for p in out["parts"]}
    assert all(_positive(parts[(s, 2, "step_s")]["forecast_ms"]) for s in (1, 2))
    assert out["forecast_spread"] is None or out["forecast_spread"] >= 0
