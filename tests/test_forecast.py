"""The speedup forecast: its arithmetic without a cluster, what earlier runs give it, and `sweep --forecast-only`.

The CLI test calibrates for real on conftest's shared 2-worker cluster (``--scheduler``) with a tiny
model, and checks that nothing trained.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from petmodel.cli import main
from petmodel.cli.json_schema import problems
from petmodel.config import RunSpec, TrainConfig
from petmodel.step_breakdown import NoiseScale
from petmodel.store import RunStore
from petmodel.studies.forecast import (
    AllreduceTiming,
    Calibration,
    PointTiming,
    RingModel,
    expected_max_z,
    fit_ring,
    forecast_rows,
)
from petmodel.studies.plan import SweepConfig, plan_sweep
from petmodel.studies.sweep_forecast import forecast_from, history


def point(workers: int, b: int, compute: float, idle: float = 0.0) -> PointTiming:
    return PointTiming(workers=workers, batch_per_worker=b, compute_s=compute, data_s=0.001, optimizer_s=0.002,
                       idle_s=idle, low_s=compute * 0.9 + idle, high_s=compute * 1.1 + idle, reps=3)


def ring_timings(model: RingModel, workers: int, sizes=(400, 100_000, 1_000_000)) -> list[AllreduceTiming]:
    return [AllreduceTiming(workers, n, model.seconds(workers, n), model.seconds(workers, n) * 0.9,
                            model.seconds(workers, n) * 1.2) for n in sizes]


def rows(*specs) -> list[SimpleNamespace]:
    return [SimpleNamespace(index=i, workers=w, global_batch=gb, batch_per_worker=gb // w, lr=0.01)
            for i, (w, gb) in enumerate(specs)]


def test_the_ring_model_is_fitted_back_and_extrapolates():
    truth = RingModel(bandwidth=2e9, latency_s=40e-6)
    fitted = fit_ring(ring_timings(truth, 2) + ring_timings(truth, 3))
    assert fitted.bandwidth == pytest.approx(2e9, rel=1e-6) and fitted.latency_s == pytest.approx(40e-6, rel=1e-6)
    assert fitted.seconds(1, 10**6) == 0.0
    assert fitted.seconds(16, 10**6) == pytest.approx(2 * 15 / 16 * 1e6 / 2e9 + 30 * 40e-6)
    # Latency alone (every size costs the same): no negative bandwidth term.
    flat = fit_ring([AllreduceTiming(2, n, 1e-3, 1e-3, 1e-3) for n in (100, 10_000)])
    assert flat.latency_s == pytest.approx(0.5e-3, rel=0.05) and flat.bandwidth > 1e10
    assert fit_ring([]) is None


def test_equivalent_rows_forecast_the_step_time_ratio():
    ring = RingModel(bandwidth=1e9, latency_s=50e-6)
    grad = 1_200_000
    cal = Calibration(points=(point(1, 64, 0.040), point(2, 32, 0.022, idle=0.002)),
                      allreduces=tuple(ring_timings(ring, 2, (grad, grad // 4, 80))), grad_bytes=grad,
                      agree={2: 80e-6})
    one, two = forecast_rows(rows((1, 64), (2, 64)), cal, equivalent=True, reference_steps={0.01: (64, 500.0)})
    step1 = 0.040 + 0.001 + 0.002
    step2 = 0.022 + 0.002 + ring.seconds(2, grad) + 0.001 + 0.002 + 80e-6 / 8
    assert one.step_s == pytest.approx(step1) and two.step_s == pytest.approx(step2)
    assert two.parts["allreduce_s"] == pytest.approx(ring.seconds(2, grad)) and one.parts["allreduce_s"] == 0
    assert (one.speedup, one.speedup_low, one.speedup_high) == (1.0, 1.0, 1.0)  # the reference, by definition
    assert two.speedup == pytest.approx(step1 / step2)
    assert two.speedup_low < two.speedup < two.speedup_high
    assert one.steps_ratio == two.steps_ratio == 1.0 and two.basis == "measured"
    assert two.time_to_target_s == pytest.approx(500 * step2)  # the same steps: an equivalent row


def test_rows_that_change_the_global_batch_use_the_noise_scale():
    cal = Calibration(points=(point(1, 32, 0.020), point(2, 32, 0.021, idle=0.001)),
                      allreduces=tuple(ring_timings(RingModel(1e9, 50e-6), 2, (10_000, 2_500, 80))),
                      grad_bytes=10_000)
    planned = rows((1, 32), (2, 64))
    unknown = forecast_rows(planned, cal, equivalent=False)
    assert unknown[1].speedup is None and unknown[1].time_to_target_s is None  # no noise scale: no guess
    noise = NoiseScale(b_noise=100.0, error=20.0, windows=30, small_batch=32, large_batch=64)
    one, two = forecast_rows(planned, cal, equivalent=False, noise=noise, reference_steps={0.01: (32, 1000.0)})
    ratio = (1 + 100 / 64) / (1 + 100 / 32)  # fewer, larger steps
    assert two.steps_ratio == pytest.approx(ratio)
    assert two.speedup == pytest.approx(one.step_s / (two.step_s * ratio))
    assert two.speedup_low < two.speedup < two.speedup_high  # the noise scale's error widens the range
    assert two.time_to_target_s == pytest.approx(1000 * ratio * two.step_s)


def test_a_batch_or_worker_count_not_measured_is_fitted_and_says_so():
    ring = RingModel(bandwidth=1e9, latency_s=50e-6)
    cal = Calibration(points=(point(1, 64, 0.040), point(1, 128, 0.078), point(2, 32, 0.022)),
                      allreduces=tuple(ring_timings(ring, 2, (10_000, 2_500, 80))), grad_bytes=10_000)
    [four] = forecast_rows(rows((4, 64)), cal, equivalent=True)
    assert four.parts["compute_s"] == pytest.approx(0.002 + 0.038 * 16 / 64 * 4 / 4, rel=0.2)  # the 1-worker line
    assert four.parts["allreduce_s"] == pytest.approx(ring.seconds(4, 10_000))
    assert "fitted" in four.basis and "ring model" in four.basis
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again == cal


def test_earlier_runs_give_the_noise_scale_and_the_steps_to_the_target(tmp_path: Path):
    store = RunStore(tmp_path)
    spec = RunSpec(train=TrainConfig(max_seconds=None, max_steps=100, batch_size=32, lr=0.01), hidden=32)
    run_id = store.create_run(spec.with_(workers=2).to_dict(), status="running")
    store.add_metrics(run_id, [{"kind": "val", "step": 40, "samples": 2560, "val_nll": 2.9},
                               {"kind": "val", "step": 80, "samples": 5120, "val_nll": 2.5}])
    windows = []
    for i in range(12):
        for rank in (0, 1):
            windows.append({"rank": rank, "step": 17 + 16 * i, "step_s": 0.1, "rank_batch": 32,
                            "grad_sq": 2.0 + 600 / 32 + (0.3 if rank else -0.3), "grad_sq_global": 2.0 + 600 / 64})
    store.add_metrics(run_id, windows)
    store.update_run(run_id, status="completed", result={"global_batch": 64})
    noise, steps = history(store, spec, target_nll=2.6)
    assert noise is not None and noise.b_noise == pytest.approx(300, rel=0.01)
    assert steps == {0.01: (64, 80.0)}  # 5120 samples at the first validation under 2.6, at 64 a step
    other = spec.with_(hidden=64)  # another model: nothing to go on
    assert history(store, other, target_nll=2.6) == (None, {})

    config = SweepConfig(base=spec, workers=[1, 2], global_batches=[64], lrs=[0.01])
    plan = plan_sweep(config, 2, 10_000)
    cal = Calibration(points=(point(1, 64, 0.04), point(2, 32, 0.02)),
                      allreduces=tuple(ring_timings(RingModel(1e9, 5e-5), 2, (10_000, 2_500, 80))), grad_bytes=10_000)
    forecast = forecast_from(cal, store, config, plan)
    assert [r.time_to_target_s is not None for r in forecast.rows] == [True, True]
    assert forecast.speedup_of(2, 64, 0.01) == forecast.rows[1].speedup


def test_sweep_forecast_only_calibrates_in_seconds_and_trains_nothing(cluster, tmp_path: Path, capsys):
    store = tmp_path / "store"
    code = main(["sweep", "--workers", "1,2,4", "--global-batch", "64", "--forecast-only", "--embed", "8", "--hidden",
                 "16", "--scheduler", cluster.scheduler.address, "--store", str(store), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert problems("sweep --forecast-only", result) == []
    one, two, four = result["rows"]  # 4 workers on a 2-worker cluster: forecast beyond it, not dropped
    assert (one["workers"], two["workers"], four["workers"]) == (1, 2, 4) and one["forecast_speedup"] == 1.0
    assert [r["beyond_cluster"] for r in (one, two, four)] == [False, False, True]
    assert four["basis"].startswith("beyond the cluster") and four["speedup_low"] < four["speedup_high"]
    assert any("4 workers are beyond the cluster" in n for n in result["notes"]), result["notes"]
    # A 16-unit model's step is a few milliseconds, so other test processes' load bursts move this ratio a lot
    # (0.19 and 6.1 were seen in full-suite runs on 2 cores): the bounds only say it is a finite, positive
    # figure; the forecast's accuracy is measured by benchmarks/bench_forecast.py on a quiet machine.
    assert 0.05 < two["forecast_speedup"] < 10 and two["speedup_low"] <= two["forecast_speedup"] <= two["speedup_high"]
    assert two["allreduce_s"] > 0 and one["allreduce_s"] == 0 and two["basis"] == "measured"
    assert result["calibration_seconds"] < 30 and "measured on 2 workers" in result["calibration_source"]
    assert RunStore(store).list_runs() == [] and RunStore(store).list_studies() == []  # nothing trained

    code = main(["sweep", "--workers", "1,2", "--global-batch", "64", "--forecast-only", "--embed", "8", "--hidden",
                 "16", "--scheduler", cluster.scheduler.address, "--store", str(store)])
    table = capsys.readouterr().out
    assert code == 0 and table.splitlines()[1].split()[:3] == ["workers", "global", "per-wkr"]


def test_the_gpu_grid_forecast_from_stated_assumptions_follows_the_ring_model():
    from benchmarks.bench_forecast import GPU_ASSUMPTIONS, gpu_grid

    grid = gpu_grid()
    assert grid["assumptions"]["grad_bytes"] > 0 and set(GPU_ASSUMPTIONS) <= set(grid["assumptions"])
    rows = {(r["workers"], r["global_batch"]): r for r in grid["rows"]}
    assert set(rows) == {(n, g) for n in (1, 4, 16) for g in (1024, 4096, 16384)}
    for g in (1024, 4096, 16384):
        assert rows[(1, g)]["forecast_speedup"] == 1.0
        for n in (4, 16):
            r = rows[(n, g)]
            assert r["speedup_low"] <= r["forecast_speedup"] <= r["speedup_high"]
            assert 0 < r["forecast_speedup"] < n  # the all-reduce and fixed costs never vanish
    # a larger global batch gives each rank more compute to hide the same all-reduce behind
    assert rows[(4, 1024)]["forecast_speedup"] < rows[(4, 4096)]["forecast_speedup"] < rows[(4, 16384)]["forecast_speedup"]


def test_worker_counts_beyond_the_cluster_are_forecast_from_it_marked_and_wider():
    """The write-up's 1/4/16 grid from a 2-worker calibration: every row forecast, 4 and 16 marked as beyond
    the cluster, their compute per rank as measured on 2, the all-reduce from the ring, the slowest rank's
    wait grown with their number, and ranges wider than a measured row's."""
    ring = RingModel(bandwidth=1e9, latency_s=50e-6)
    grad = 1_200_000
    cal = Calibration(points=(point(1, 4096, 2.0), point(2, 2048, 1.02, idle=0.01), point(2, 1024, 0.52, idle=0.008),
                              point(2, 256, 0.14, idle=0.005)),
                      allreduces=tuple(ring_timings(ring, 2, (grad, grad // 4, 80))), grad_bytes=grad)
    one, two, four, sixteen = forecast_rows(rows((1, 4096), (2, 4096), (4, 4096), (16, 4096)), cal, equivalent=True)
    assert [r.beyond_cluster for r in (one, two, four, sixteen)] == [False, False, True, True]
    assert two.basis == "measured" and four.basis.startswith("beyond the cluster (measured up to 2 workers)")
    assert "all-reduce ring model" in sixteen.basis
    assert four.parts["compute_s"] == pytest.approx(0.52) and sixteen.parts["compute_s"] == pytest.approx(0.14)
    assert sixteen.parts["allreduce_s"] == pytest.approx(ring.seconds(16, grad))
    assert four.parts["idle_s"] == pytest.approx(0.008 * expected_max_z(4) / expected_max_z(2))
    assert sixteen.parts["idle_s"] == pytest.approx(0.005 * expected_max_z(16) / expected_max_z(2))
    assert expected_max_z(1) == 0 < expected_max_z(2) < expected_max_z(4) < expected_max_z(16) < 2
    for r in (two, four, sixteen):
        assert r.speedup_low < r.speedup < r.speedup_high and r.speedup < r.workers * 1.05
    width = {r.workers: (r.speedup_high - r.speedup_low) / r.speedup for r in (two, four, sixteen)}
    assert width[4] > width[2] and width[16] > width[2]


def test_a_speedup_above_linear_is_a_calibration_error_never_a_result():
    """A calibration whose 2 workers step 2.9× as fast as one (seen on a 2-core machine) gives no speedup for
    that row: the basis says why, a note says it was measured twice."""
    from petmodel.studies.target_plan import faster_than_linear

    cal = Calibration(points=(point(1, 64, 0.090), point(2, 32, 0.015)),
                      allreduces=tuple(ring_timings(RingModel(1e9, 5e-5), 2, (10_000, 2_500, 80))), grad_bytes=10_000)
    assert [(n, b) for n, b, _ in faster_than_linear(cal, [1, 2], [64])] == [(2, 64)]
    config = SweepConfig(base=RunSpec(), workers=[1, 2], global_batches=[64], lrs=[0.01])
    forecast = forecast_from(cal, None, config, plan_sweep(config, 2, 10_000))
    one, two = forecast.rows
    assert one.speedup == 1.0 and two.speedup is None and two.basis.startswith("calibration error: 2 workers stepped")
    assert any("faster than linear" in n for n in forecast.notes), forecast.notes
