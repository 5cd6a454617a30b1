"""Where the step time goes, per rank (petmodel.step_timing, petmodel.step_breakdown), and killing a rank's worker.

Real parts: the loop in this process, a 2-worker run on conftest's shared cluster over gloo, the
store in SQLite, the CLI in this process. The kill test ends a worker of the shared cluster (its
nanny starts a new one) and waits until the cluster has its two workers again.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
from pathlib import Path

import pytest

from petmodel.cli import main
from petmodel.cluster.launch import launch_run
from petmodel.cluster.worker_kill import rank_worker, scheduler_of
from petmodel.config import RunSpec, TrainConfig
from petmodel.errors import PetmodelError
from petmodel.step_breakdown import PARTS, by_rank, noise_scale, step_time_summary, unaccounted
from petmodel.store import RunStore
from petmodel.store.schema import STEP_TIME_COLUMNS

TINY = dict(hidden=32, embed=16, dropout=0.0)


def tiny_spec(**train) -> RunSpec:
    cfg = dict(max_seconds=None, max_steps=80, batch_size=32, lr=0.01)
    cfg.update(train)
    return RunSpec(train=TrainConfig(**cfg), **TINY)


def cli_json(capsys, *args: str) -> tuple[int, dict | None, str]:
    try:
        code = main([*args, "--json"])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return code, (json.loads(lines[-1]) if lines and code == 0 else None), err + out


def test_in_process_windows_add_up_and_have_no_collectives(corpus):
    from petmodel.train import train_model

    spec = tiny_spec(max_steps=50)
    train, _ = corpus.encode_splits()
    rows: list[dict] = []
    train_model(spec.model_config(corpus.alphabet.vocab_size), spec.train, train, None, on_metrics=rows.append)
    windows = [r for r in rows if "step_s" in r]
    assert [r["step"] for r in windows] == [17, 33, 49]  # one per 16 steps, on the row after the window
    for w in windows:
        assert w["allreduce_s"] == w["idle_s"] == w["agree_s"] == 0.0  # one process: nothing to wait for
        assert w["compute_s"] > 0 and w["data_s"] > 0 and w["optimizer_s"] > 0 and w["rank_batch"] == 32
        assert abs(unaccounted(w)) < 0.10, w  # the laps account for the window's measured wall time
        assert "grad_sq" not in w  # the noise scale needs two batch sizes: DDP only
    # Rows without a window stay as they were (the curves read them).
    assert set(rows[0]) == {"kind", "rank", "step", "epoch", "elapsed", "samples", "global_samples", "loss",
                            "samples_per_s"}


def test_the_recording_turned_off_adds_no_window_and_trains_the_same(corpus, monkeypatch):
    from petmodel.train import train_model

    spec = tiny_spec(max_steps=20)
    train, _ = corpus.encode_splits()
    curves = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("PETMODEL_STEP_TIMING", setting)
        rows: list[dict] = []
        train_model(spec.model_config(corpus.alphabet.vocab_size), spec.train, train, None, on_metrics=rows.append)
        curves[setting] = [r["loss"] for r in rows if r.get("kind") == "train"]
        assert any("step_s" in r for r in rows) is (setting == "1")
    assert curves["0"] == curves["1"]  # timing only observes: the same seed trains the same curve


def test_a_two_worker_run_splits_the_wait_and_its_medians_are_in_the_json(cluster, corpus, tmp_path: Path, capsys):
    store = RunStore(tmp_path)
    result = launch_run(cluster, tiny_spec().with_(workers=2), store, corpus=corpus).wait(120)
    rows = store.step_time_rows([result["run_id"]])[result["run_id"]]
    assert sorted({(r["rank"], r["step"]) for r in rows}) == [(r, s) for r in (0, 1) for s in (17, 33, 49, 65)]
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    for step, pair in by_step.items():
        # The exposed all-reduce is each step's smallest wait, agreed by both ranks: the same on both.
        assert pair[0]["allreduce_s"] == pytest.approx(pair[1]["allreduce_s"], rel=1e-9)
        assert all(r["allreduce_s"] > 0 and r["idle_s"] >= 0 and r["agree_s"] > 0 for r in pair)
        assert pair[0]["rank_batch"] + pair[1]["rank_batch"] == 64  # work-balanced slices of the global batch
        assert pair[0]["grad_sq_global"] == pair[1]["grad_sq_global"] > 0 and all(r["grad_sq"] > 0 for r in pair)
    assert set(by_rank(rows)) == {0, 1}

    code, listing, err = cli_json(capsys, "runs", "--store", str(tmp_path))
    assert code == 0, err
    [run] = [r for r in listing["runs"] if r["run_id"] == result["run_id"]]
    step_time = run["step_time"]
    assert step_time == step_time_summary(rows) and step_time["windows"] == 8
    assert set(step_time) == {"step_s", *PARTS, "windows"}
    assert step_time["compute_s"] > 0 and step_time["allreduce_s"] > 0
    assert abs(unaccounted(step_time)) < 0.10, step_time  # the parts add up to the measured step time


def test_summaries_and_the_noise_scale_from_rows():
    """Pure: the typical window adds up; B_noise = tr(Σ)/|G|² comes back from norms made with it."""
    rows = [{"run_id": "r", "rank": 0, "step": 17 + 16 * i, "step_s": s, "compute_s": s * 0.6, "allreduce_s": s * 0.2,
             "idle_s": s * 0.1, "data_s": s * 0.05, "optimizer_s": s * 0.05, "report_s": 0.0, "agree_s": 0.0}
            for i, s in enumerate([9.0, 0.1, 0.11, 0.1, 0.12, 0.1, 0.09, 5.0])]  # two stalled windows
    summary = step_time_summary(rows)
    assert summary["step_s"] == pytest.approx(0.1075) and abs(unaccounted(summary)) < 1e-9  # the middle four
    assert step_time_summary([{"step": 3, "loss": 1.0}]) is None

    rng = random.Random(0)
    g2, trace, b, world = 2.0, 600.0, 32, 4  # B_noise = 300 names
    noisy = []
    for i in range(60):
        step = 17 + 16 * i
        big = g2 + trace / (b * world)
        for rank in range(world):
            noisy.append({"run_id": "r", "rank": rank, "step": step, "step_s": 0.1, "rank_batch": b,
                          "grad_sq": (g2 + trace / b) * rng.uniform(0.8, 1.2), "grad_sq_global": big})
    estimate = noise_scale(noisy)
    assert estimate is not None and estimate.windows == 54  # the first tenth left out
    assert estimate.b_noise == pytest.approx(300, rel=0.1) and 0 < estimate.error < 60
    assert estimate.small_batch == 32 and estimate.large_batch == 128
    assert estimate.steps_ratio(1024, 256) == pytest.approx((1 + estimate.b_noise / 1024) / (1 + estimate.b_noise / 256))
    assert noise_scale(noisy[:8]) is None  # too few windows to say


def test_an_older_store_gains_the_step_time_columns(tmp_path: Path):
    RunStore(tmp_path)  # creates the current schema; then make it look like a version-2 store
    with sqlite3.connect(tmp_path / "runs.sqlite") as conn:
        for column in STEP_TIME_COLUMNS:
            conn.execute(f"ALTER TABLE metrics DROP COLUMN {column}")
        conn.execute("PRAGMA user_version = 2")
    store = RunStore(tmp_path)
    with sqlite3.connect(tmp_path / "runs.sqlite") as conn:
        have = {row[1] for row in conn.execute("PRAGMA table_info(metrics)")}
    assert set(STEP_TIME_COLUMNS) <= have
    run_id = store.create_run(tiny_spec().to_dict())
    store.add_metrics(run_id, [{"step": 16, "loss": 2.0}, {"step": 17, "step_s": 0.2, "compute_s": 0.1}])
    assert [r["step_s"] for r in store.step_time_rows([run_id])[run_id]] == [0.2]  # only the window's row


@pytest.mark.slow  # a long end-to-end path: the full suite's, not the edit loop's
def test_killing_a_rank_from_the_cli_re_forms_the_run(cluster, corpus, tmp_path: Path, capsys):
    store = RunStore(tmp_path)
    spec = tiny_spec(max_steps=700, checkpoint_every_s=0.2).with_(workers=2)
    handle = launch_run(cluster, spec, store, corpus=corpus, pg_timeout_s=5)
    try:
        deadline = time.monotonic() + 90
        while not (store.state_path(handle.run_id).is_file() and handle.last_step > 30) \
                and time.monotonic() < deadline and not handle.done():
            time.sleep(0.05)
        assert not handle.done(), "the run ended before its worker could be killed; give it more steps"
        victim = rank_worker(store, handle.run_id, 1)
        assert scheduler_of(victim) == cluster.scheduler.address  # what the CLI asks without --scheduler
        code, killed, err = cli_json(capsys, "runs", "kill-worker", handle.run_id, "--rank", "1",
                                     "--scheduler", cluster.scheduler.address, "--store", str(tmp_path))
        assert code == 0, err
        assert killed["worker"] == victim and killed["rank"] == 1 and killed["pid"] > 0
        result = handle.wait(120)
    finally:
        if not handle.done():
            handle.cancel()
            handle.join(60)
        cluster.wait_for_workers(2, timeout=60)  # the nanny's new worker: the shared cluster is whole again
    run = store.get_run(handle.run_id)
    assert result["status"] == "completed" and run.restarts == 1 and result["restarts"] == 1, run.error
    [lost] = run.lost_workers
    assert lost["worker"] == victim and lost["rank"] == 1 and 0 < lost["step"] < 700
    assert result["steps"] == 700
    windows = store.step_time_rows([handle.run_id])[handle.run_id]
    assert max(r["step"] for r in windows) > lost["step"]  # the re-formed group kept timing its steps

    # A run that is over has no worker to end: one sentence, exit 1; a rank it never had: exit 2.
    code, _, err = cli_json(capsys, "runs", "kill-worker", handle.run_id, "--rank", "0", "--store", str(tmp_path))
    assert code == 1 and "not running" in err and "Traceback" not in err
    with pytest.raises(PetmodelError, match="no worker to end"):
        rank_worker(store, handle.run_id, 5)
