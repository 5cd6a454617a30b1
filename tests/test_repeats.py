"""A sweep's repeats (issue 51): planned interleaved under distinct seeds, and summarised as medians with ranges.

Pure: planned rows and synthetic run rows, no cluster (the CLI sweep with ``--repeats 2`` runs in
tests/test_experiments.py).
"""

from __future__ import annotations

import pytest

from petmodel.config import RunSpec
from petmodel.errors import UsageError
from petmodel.studies.plan import SweepConfig, plan_sweep, point_spec
from petmodel.studies.repeats import UNKNOWN, Spread, speedup_spread, spread_note, summarise


def test_repeats_are_interleaved_under_distinct_seeds() -> None:
    config = SweepConfig(base=RunSpec(), workers=[1, 2], global_batches=[64], lrs=[0.01], repeats=3)
    plan = plan_sweep(config, 2, 10_000)
    assert [(p.workers, p.repeat) for p in plan.points] == [(1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)]
    seeds = [point_spec(config, p, "s1").train.seed for p in plan.points]
    assert seeds == [0, 0, 1, 1, 2, 2]
    assert point_spec(config, plan.points[2], "s1").name == "sweep s1 · w1 b64×1=64 lr0.01 #2"
    named = SweepConfig(base=RunSpec(), workers=[1, 2], global_batches=[64], lrs=[0.01], name="ux4 sweep " * 12)
    run_name = point_spec(named, plan.points[3], "s1").name  # the study's label, cut to fit a run name
    assert run_name.startswith("ux4 sweep") and run_name.endswith("… · w2 b32×2=64 lr0.01 #2") and len(run_name) == 100
    assert plan.points[2].label.endswith("#2") and not plan.points[0].label.endswith("#1")
    for bad in (0, 11, 2.5, True):
        with pytest.raises(UsageError, match="Repeats must be"):
            SweepConfig(base=RunSpec(), workers=[1, 2], global_batches=[64], lrs=[0.01], repeats=bad)


def _row(workers: int, t: float | None, seed: int, gb: int = 64) -> dict:
    return {"workers": workers, "global_batch": gb, "batch_per_worker": gb // workers, "lr": 0.01,
            "time_to_target": t, "run_id": f"r{workers}-{seed}", "seed": seed}


def test_the_speedup_is_a_ratio_of_medians_ranged_by_the_paired_repeats() -> None:
    rows = [_row(1, 10.0, 0), _row(2, 5.0, 0), _row(1, 12.0, 1), _row(2, 8.0, 1), _row(1, 11.0, 2), _row(2, 5.5, 2)]
    forecast = {(2, 64, 0.01): (2.1, 1.8, 2.3), (1, 64, 0.01): (1.0, 1.0, 1.0)}
    one, two = summarise(rows, equivalent=True, forecast=forecast)
    assert (one["time_to_target_median"], one["time_to_target_low"], one["time_to_target_high"]) == (11.0, 10.0, 12.0)
    assert one["speedup_median"] == 1.0 and one["spread_note"] is None
    assert two["runs"] == 3 and two["seeds"] == [0, 1, 2] and two["run_ids"] == ["r2-0", "r2-1", "r2-2"]
    assert two["speedup_median"] == pytest.approx(11 / 5.5, abs=1e-3)
    assert two["speedup_low"] == pytest.approx(12 / 8, abs=1e-3) and two["speedup_high"] == pytest.approx(2.0)
    assert two["forecast_speedup"] == 2.1 and two["forecast_held"] is True  # 1.8 ≤ 2.0 ≤ 2.3
    assert two["spread_note"] is not None and "±" in two["spread_note"]  # 1.5–2.0 around 2.0: ±12%, wider than ±10%


def test_one_run_a_side_says_the_spread_is_unknown_and_a_narrow_range_says_nothing() -> None:
    one, two = summarise([_row(1, 10.0, 0), _row(2, 5.0, 0)], equivalent=True)
    assert two["speedup_median"] == two["speedup_low"] == two["speedup_high"] == 2.0
    assert two["spread_note"] == UNKNOWN and two["forecast_held"] is None
    narrow = speedup_spread([10.0, 10.2, 9.9], [5.0, 5.05, 5.0])
    assert narrow is not None and spread_note(narrow, 3) is None
    missed = summarise([_row(1, 10.0, 0), _row(2, None, 0)], equivalent=True)[1]
    assert missed["reached"] == 0 and missed["speedup_median"] is None and missed["time_to_target_median"] is None
    assert Spread.of([]) is None and speedup_spread([], [1.0]) is None


def test_compare_groups_picked_repeats_into_a_median_speedup_with_its_range(tmp_path) -> None:
    """Compare's repeats view on real store rows: three 1-worker and three 2-worker runs of one setting give one
    row each with the median speedup and its paired range, and a chart with a bar per setting; one run a
    side has no repeats to show."""
    from petmodel.app.spread_view import has_repeats, spread_chart, spread_frame, spread_rows
    from petmodel.comparison import compare_runs
    from petmodel.store import RunStore
    from tests.test_comparison import _run, _spec

    store = RunStore(tmp_path)
    ids = []
    for one_t, two_t in ((2.0, 1.0), (2.2, 1.0), (2.1, 1.2)):  # interleaved, as a sweep runs them
        ids.append(_run(store, _spec(1, 64), [(one_t / 2, 3.0), (one_t, 2.5)]))
        ids.append(_run(store, _spec(2, 64), [(two_t / 2, 3.0), (two_t, 2.5)]))
    runs = [store.get_run(i) for i in ids]
    figures = compare_runs(runs, store.metrics_frame(ids), 2.5, candidates=runs)
    summary = spread_rows(runs, figures)
    one, two = summary
    assert (one["workers"], one["runs"], two["workers"], two["runs"]) == (1, 3, 2, 3) and has_repeats(summary)
    assert two["time_to_target_median"] == pytest.approx(1.0) and two["speedup_median"] == pytest.approx(2.1)
    assert two["speedup_low"] == pytest.approx(2.1 / 1.2, abs=1e-3) and two["speedup_high"] == pytest.approx(2.2)
    frame = spread_frame(summary)
    assert frame.loc[1, "speedup_range"] == "1.75–2.20×" and frame.loc[1, "runs"] == 3
    assert frame.loc[1, "speedup_median"] == pytest.approx(2.1)  # a number: the table sorts it as one
    chart = spread_chart(summary).to_dict()
    assert [layer["mark"]["type"] for layer in chart["layer"]] == ["line", "rule", "tick", "tick", "point"]
    single = spread_rows(runs[:2], compare_runs(runs[:2], store.metrics_frame(ids[:2]), 2.5, candidates=runs[:2]))
    assert not has_repeats(single) and single[1]["spread_note"].startswith("1 run a side")
