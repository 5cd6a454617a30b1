"""One home for every comparison figure (petmodel.comparison): time to target on the training clock, interpolated
between the validations either side of the target, and a speedup only against a measured, equivalent 1-worker run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from petmodel.cli import main
from petmodel.cli.json_schema import problems
from petmodel.app.charts import speedup_chart
from petmodel.comparison import compare_runs, figures_frame
from petmodel.config import RunSpec, TrainConfig
from petmodel.store import RunStore
from petmodel.studies.results import sweep_table


def _spec(workers: int, global_batch: int, lr: float = 0.01, hidden: int = 16) -> RunSpec:
    train = TrainConfig(max_seconds=None, max_steps=40, batch_size=global_batch // workers, lr=lr)
    return RunSpec(train=train, hidden=hidden, embed=8).with_(workers=workers)


def _run(store: RunStore, spec: RunSpec, points: list[tuple[float, float]], *, eval_s: float = 0.0,
         study_id: str | None = None) -> str:
    """A finished run with hand-written metrics: per point, rank 0's train row, then a validation ``eval_s`` later."""
    run_id = store.create_run(spec.to_dict(), status="completed", study_id=study_id,
                              kind="sweep" if study_id else "train")
    store.update_run(run_id, best_val_nll=min(v for _, v in points), val_nll=min(v for _, v in points))
    rows, paused = [], 0.0
    for i, (t, v) in enumerate(points):
        rows.append({"kind": "train", "rank": 0, "step": 10 * (i + 1), "elapsed": t + paused, "loss": 3.0,
                     "samples": 100 * (i + 1)})
        paused += eval_s
        rows.append({"kind": "val", "rank": 0, "step": 10 * (i + 1), "elapsed": t + paused, "val_nll": v,
                     "samples": 100 * (i + 1)})
    store.add_metrics(run_id, rows)
    return run_id


def _cli(capsys, store: RunStore, *args: str) -> tuple[int, dict, str]:
    code = main(["runs", "compare", *args, "--store", str(store.root), "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out.strip().splitlines()[-1]) if code == 0 else {}), err


def test_a_lone_2_worker_run_has_no_speedup_and_says_why(tmp_path, capsys) -> None:
    store = RunStore(tmp_path)
    two = _run(store, _spec(2, 64), [(1.0, 3.0), (2.0, 2.4)])
    code, result, err = _cli(capsys, store, two, "--target-nll", "2.5")
    assert code == 0, err
    assert problems("runs compare", result) == []
    [row] = result["runs"]
    assert row["time_to_target"] == pytest.approx(1.0 + 0.5 / 0.6, abs=1e-3)  # NLL 3.0 → 2.4 over 1 → 2 s: 2.5 at 1.83
    assert row["speedup"] is None and row["efficiency"] is None
    assert row["baseline_id"] is None and "no equivalent 1-worker run" in row["reason"]


def test_the_speedup_is_the_ratio_of_measured_training_clock_times(tmp_path, capsys) -> None:
    store = RunStore(tmp_path)
    # Validation pauses of 0.5 s each: wall times are 1.5/3.0/4.5 s for the first run, training-clock 1/2/3 s.
    one = _run(store, _spec(1, 64), [(1.0, 3.0), (2.0, 2.7), (3.0, 2.4)], eval_s=0.5)
    two = _run(store, _spec(2, 64), [(0.6, 2.9), (1.2, 2.45)], eval_s=0.5)
    other = _run(store, _spec(1, 128), [(0.5, 2.3)])  # another global batch: never a default baseline
    code, result, err = _cli(capsys, store, one, two, "--target-nll", "2.5")
    assert code == 0, err
    rows = {r["run_id"]: r for r in result["runs"]}
    # Where NLL 2.5 was crossed between two validations, on the training clock (no pauses): 2.7 → 2.4 over 2 → 3 s,
    # and 2.9 → 2.45 over 0.6 → 1.2 s; the wall clock (1.5 s pauses' worth) interpolates between its own times.
    t_one, t_two = 2.0 + 0.2 / 0.3, 0.6 + 0.6 * 0.4 / 0.45
    assert rows[one]["time_to_target"] == pytest.approx(t_one, abs=1e-3)
    assert rows[one]["wall_time_to_target"] == pytest.approx(3.0 + 1.5 * 0.2 / 0.3, abs=1e-3)
    assert rows[two]["time_to_target"] == pytest.approx(t_two, abs=1e-3)
    assert rows[two]["wall_time_to_target"] == pytest.approx(1.1 + 1.1 * 0.4 / 0.45, abs=1e-3)
    assert rows[two]["baseline_id"] == one and rows[two]["equivalent"] is True
    assert rows[two]["speedup"] == pytest.approx(t_one / t_two, abs=1e-3)
    assert rows[two]["efficiency"] == pytest.approx(t_one / t_two / 2, abs=1e-3)
    assert rows[one]["speedup"] == 1.0 and rows[two]["reason"] is None
    # Asked for by name, a non-equivalent baseline gives a speedup flagged as such.
    code, forced, _ = _cli(capsys, store, two, "--baseline", other, "--target-nll", "2.5")
    [row] = forced["runs"]
    assert row["equivalent"] is False and row["speedup"] == pytest.approx(0.5 / t_two, abs=1e-3)  # its first validation
    assert "not equivalent" in row["reason"] and "global batch 64 vs the baseline's 128" in row["reason"]
    code, _, err = _cli(capsys, store, "nope")
    assert code == 1 and err.count("\n") == 1 and "No run 'nope'" in err
    # A unique start of an id and a run's name name the same runs as in `generate --model` (issue 53).
    store.update_run(two, name="Two Workers")
    code, by_ref, err = _cli(capsys, store, one[:-2], "two workers", "--target-nll", "2.5")
    assert code == 0, err
    assert [r["run_id"] for r in by_ref["runs"]] == [one, two] and by_ref["runs"][1]["speedup"] == rows[two]["speedup"]
    code, _, err = _cli(capsys, store, "2", "--target-nll", "2.5")  # every id here starts with 2
    assert code == 1 and "matches 3 runs" in err and "give more of the run id" in err


def test_the_sweep_table_gives_the_same_times_as_runs_compare(tmp_path, capsys) -> None:
    store = RunStore(tmp_path)
    study = store.create_study({"target_nll": 2.5, "equivalent": True}, kind="sweep")
    one = _run(store, _spec(1, 64), [(1.0, 3.0), (2.0, 2.7), (3.0, 2.4)], eval_s=0.25, study_id=study)
    two = _run(store, _spec(2, 64), [(0.6, 2.9), (1.2, 2.45)], eval_s=0.25, study_id=study)
    outside = _run(store, _spec(1, 64), [(0.1, 2.0)])  # equivalent and faster, but not the study's own
    rows = {r["run_id"]: r for r in sweep_table(store, study)}
    _, compared, _ = _cli(capsys, store, one, two, "--target-nll", "2.5")
    for r in compared["runs"]:
        assert rows[r["run_id"]]["time_to_target"] == r["time_to_target"]
        assert rows[r["run_id"]]["speedup"] == r["speedup"]
    assert rows[two]["speedup"] == pytest.approx((2.0 + 0.2 / 0.3) / (0.6 + 0.6 * 0.4 / 0.45), abs=1e-3)  # its own
    assert compared["runs"][1]["baseline_id"] == one != outside


def test_a_run_that_never_reached_the_target_and_a_baseline_that_did_not() -> None:
    import pandas as pd

    runs = [{"id": "a", "config": _spec(1, 64).to_dict(), "created": 1},
            {"id": "b", "config": _spec(2, 64).to_dict(), "created": 2}]
    frame = pd.DataFrame([{"run_id": "a", "kind": "val", "rank": 0, "elapsed": 1.0, "val_nll": 3.0},
                          {"run_id": "b", "kind": "val", "rank": 0, "elapsed": 1.0, "val_nll": 2.0}])
    a, b = compare_runs(runs, frame, 2.5)
    assert a.time_to_target is None and a.speedup is None and a.reason == "did not reach NLL ≤ 2.5"
    assert b.time_to_target == 1.0 and b.speedup is None and b.reason == "its baseline a did not reach NLL ≤ 2.5"


def test_compare_page_shows_no_speedup_without_an_equivalent_1_worker_run(tmp_path, monkeypatch) -> None:
    """Compare, as the page draws it: a lone 2-worker run gets no speedup (no table value, no chart point) and
    says why; beside an equivalent 1-worker run it gets the measured ratio."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("PETMODEL_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)
    store = RunStore(tmp_path / "store")
    two = _run(store, _spec(2, 64), [(1.0, 3.0), (2.0, 2.4)])

    def compare() -> tuple[AppTest, dict]:
        at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "streamlit_app.py"), default_timeout=30)
        at.switch_page("pages/compare.py").run()
        assert not at.exception
        table = next(df.value for df in at.dataframe if "speedup" in df.value.columns)
        return at, {r["workers"]: r for r in table.to_dict("records")}

    at, rows = compare()
    assert rows["2"]["speedup"] == "—" and rows["2"]["efficiency"] == "—"
    assert any("no equivalent 1-worker run" in c.value for c in at.caption)
    figures = compare_runs([store.get_run(two)], store.metrics_frame([two]), 2.5)
    chart = speedup_chart(figures_frame(figures)).to_dict()
    measured = [d for d in chart["datasets"].values() if d and "efficiency" in d[0]]
    assert measured == []  # the chart has no point for a speedup never measured (only the ideal line)

    one = _run(store, _spec(1, 64), [(2.0, 3.0), (4.0, 2.4)])
    at, rows = compare()
    assert rows["2"]["speedup"] == "2.00" and rows["2"]["efficiency"] == "100%" and rows["1"]["speedup"] == "1.00"
    assert not any("no equivalent" in c.value for c in at.caption) and one


def test_a_1_worker_run_has_no_speedup_over_another_1_worker_run(tmp_path, capsys) -> None:
    """Issue 53: Compare gave a 1-worker run "× 0.34 over 1 worker" against another one. Only the baseline itself
    reads 1.00; another 1-worker run says why it has none, while its time to the target is still there."""
    store = RunStore(tmp_path)
    older = _run(store, _spec(1, 64), [(1.0, 3.0), (3.0, 2.4)])
    newer = _run(store, _spec(1, 64), [(1.0, 3.0), (2.0, 2.4)])
    two = _run(store, _spec(2, 64), [(0.5, 3.0), (1.0, 2.4)])
    code, result, err = _cli(capsys, store, older, newer, two, "--target-nll", "2.5")
    assert code == 0, err
    rows = {r["run_id"]: r for r in result["runs"]}
    base = rows[two]["baseline_id"]
    one_other = older if base == newer else newer
    assert rows[base]["speedup"] == 1.0 and rows[two]["speedup"] is not None
    assert rows[one_other]["speedup"] is None and rows[one_other]["time_to_target"] is not None
    assert "a 1-worker run has no speedup over another one" in rows[one_other]["reason"]
