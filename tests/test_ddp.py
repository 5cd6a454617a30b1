"""DDP on a real LocalCluster of worker processes over gloo: correctness, streaming, failures.

Runs share conftest's 2-worker ``cluster`` (each test waits for its runs, so the workers are free
again afterwards); the test that kills a worker starts a cluster of its own.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from petmodel.config import RunSpec, TrainConfig
from petmodel.cluster.connect import shutdown
from petmodel.cluster.local import start_local_cluster
from petmodel.cluster.launch import launch_run
from petmodel.cluster.run_progress import RunPhase
from petmodel.cluster.workers import describe_workers
from petmodel.errors import PetmodelError
from petmodel.model import CharLSTM
from petmodel.status import RunStatus
from petmodel.store import RunStore

TINY = dict(hidden=32, embed=16, dropout=0.0)


def tiny_spec(**train) -> RunSpec:
    cfg = dict(max_seconds=None, max_steps=6, batch_size=16, lr=0.01)
    cfg.update(train)
    return RunSpec(train=TrainConfig(**cfg), **TINY)


def test_two_workers_equal_one_worker_with_twice_the_batch(cluster, corpus, tmp_path: Path):
    store = RunStore(tmp_path)
    two = launch_run(cluster, tiny_spec().with_(workers=2), store, corpus=corpus)
    r2 = two.wait(120)
    one = launch_run(cluster, tiny_spec(batch_size=32).with_(workers=1), store, corpus=corpus)
    r1 = one.wait(120)
    assert r2["workers"] == 2 and r2["backend"] == "gloo" and r2["global_batch"] == 32
    assert (two.progress.phase, two.progress.status) == (RunPhase.ENDED, RunStatus.COMPLETED)  # the supervisor's
    assert r2["samples"] == r1["samples"] == 6 * 32
    a, b = two.rank_results[0]["final_state"], one.rank_results[0]["final_state"]
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    # The runs really moved the weights, or equality proves nothing: compare with the initial
    # weights training starts from (the same seed, the same model).
    spec = tiny_spec()
    torch.manual_seed(spec.train.seed)
    init = CharLSTM(spec.model_config(corpus.alphabet.vocab_size)).state_dict()
    assert init.keys() == a.keys()
    lr, steps = spec.train.lr, spec.train.max_steps
    for k in a:
        moved = (a[k] - init[k]).abs().max().item()
        # Every tensor moved, and by at most what 6 Adam steps can move it (about lr per step),
        # so the run started from exactly these seeded weights, not from some other init.
        assert 0 < moved <= 2 * lr * steps, (k, moved)
    assert r2["val_nll"] == pytest.approx(r1["val_nll"], abs=1e-4)


def test_metrics_from_every_rank_reach_the_store(cluster, corpus, tmp_path: Path):
    store = RunStore(tmp_path)
    seen = []
    handle = launch_run(cluster, tiny_spec(max_steps=20).with_(workers=2), store, corpus=corpus,
                        on_metrics=seen.append)
    result = handle.wait(120)
    rows = store.metrics(result["run_id"])
    train = [r for r in rows if r["kind"] == "train"]
    assert {r["rank"] for r in train} == {0, 1}
    assert sorted(r["step"] for r in train if r["rank"] == 1) == list(range(1, 21))
    assert any(r["kind"] == "val" and r["val_nll"] is not None for r in rows)
    assert len(seen) == len(rows)
    run = store.get_run(result["run_id"])
    assert run.status == "completed" and run.backend == "gloo" and len(run.workers) == 2
    assert Path(run.model_path).is_file()
    from petmodel.checkpoint import load_checkpoint

    assert load_checkpoint(run.model_path).meta["spec"]["workers"] == 2


def test_two_runs_at_once_on_disjoint_workers(cluster, corpus, tmp_path: Path):
    store = RunStore(tmp_path)
    workers = [w.address for w in describe_workers(cluster)]
    a = launch_run(cluster, tiny_spec(max_steps=15).with_(workers=1), store, corpus=corpus)
    with pytest.raises(PetmodelError, match="only 1 of the cluster's 2 are free"):
        launch_run(cluster, tiny_spec().with_(workers=2), store, corpus=corpus)
    b = launch_run(cluster, tiny_spec(max_steps=15).with_(workers=1), store, corpus=corpus)
    ra, rb = a.wait(120), b.wait(120)
    assert ra["status"] == rb["status"] == "completed"
    assert {ra["worker_addresses"][0], rb["worker_addresses"][0]} == set(workers)


def test_more_workers_than_exist(cluster, corpus, tmp_path: Path):
    store = RunStore(tmp_path)
    with pytest.raises(PetmodelError, match="Asked for 5 workers but the cluster has 2"):
        launch_run(cluster, tiny_spec().with_(workers=5), store, corpus=corpus)
    assert store.list_runs() == []


def test_cancel_stops_all_ranks(cluster, corpus, tmp_path: Path):
    store = RunStore(tmp_path)
    handle = launch_run(cluster, tiny_spec(max_steps=None, max_seconds=120).with_(workers=2), store, corpus=corpus)
    deadline = time.monotonic() + 60
    while not store.metrics(handle.run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    t = time.monotonic()
    handle.cancel()
    result = handle.wait(30)
    assert time.monotonic() - t < 10
    assert result["status"] == "cancelled" and store.get_run(handle.run_id).status == "cancelled"
    from petmodel.resume import resumable
    from petmodel.trainstate import load_state

    # the stop left rank 0's final snapshot in the store (workers share no disk with it): resumable
    assert resumable(store, handle.run_id) and load_state(store.state_path(handle.run_id))[0].step > 0
    # the workers are free again: a new run completes
    assert launch_run(cluster, tiny_spec().with_(workers=2), store, corpus=corpus).wait(120)["status"] == "completed"


def test_killed_worker_fails_the_run_without_restarts_and_the_cluster_recovers(corpus, tmp_path: Path):
    client = start_local_cluster(2, 1)
    try:
        store = RunStore(tmp_path)
        workers = describe_workers(client)
        # A short process-group timeout bounds rank 0 should it hang on the dead peer (gloo usually
        # fails it at once); the killed rank's task never finishes, and the run must not wait for it.
        handle = launch_run(client, tiny_spec(max_steps=None, max_seconds=300).with_(workers=2, max_restarts=0),
                            store, corpus=corpus, pg_timeout_s=5)
        deadline = time.monotonic() + 60
        while not any(r["rank"] == 1 for r in store.metrics(handle.run_id)) and time.monotonic() < deadline:
            time.sleep(0.2)
        victim = next(w for w in workers if w.address == handle.worker_addresses[1])
        t = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(PetmodelError, match=victim.address):
            handle.wait(60)
        assert time.monotonic() - t < 10  # under the handle's grace (pg timeout + 10 s): nobody waited on the dead rank
        assert handle.done() and handle.status == "failed"
        run = store.get_run(handle.run_id)
        assert run.status == "failed" and run.failed_worker == victim.address and run.restarts == 0
        assert victim.address in run.error and run.finished is not None
        assert store.metrics(handle.run_id)  # metrics so far are kept
        survivor = handle.worker_addresses[0]
        again = launch_run(client, tiny_spec().with_(workers=1), store, corpus=corpus, workers=[survivor])
        assert again.wait(120)["status"] == "completed"
    finally:
        shutdown(client)


def test_a_run_that_loses_a_worker_re_forms_and_ends_like_the_uninterrupted_run(cluster, corpus, tmp_path: Path):
    store = RunStore(tmp_path)
    spec = tiny_spec(max_steps=400, batch_size=64, checkpoint_every_s=0.3).with_(workers=2)
    clean = launch_run(cluster, spec, store, corpus=corpus).wait(120)

    client = start_local_cluster(2, 1)
    try:
        workers = {w.address: w for w in describe_workers(client)}
        handle = launch_run(client, spec, store, corpus=corpus, pg_timeout_s=5)
        deadline = time.monotonic() + 60
        while not (store.state_path(handle.run_id).is_file() and handle.last_step > 40) \
                and time.monotonic() < deadline and not handle.done():
            time.sleep(0.05)
        assert not handle.done(), "the run ended before a worker could be killed; give it more steps"
        victim = workers[handle.worker_addresses[1]]
        os.kill(victim.pid, signal.SIGKILL)
        result = handle.wait(120)
        run = store.get_run(handle.run_id)
        assert result["status"] == "completed" and run.status == "completed", run.error
        assert run.restarts == 1 and result["restarts"] == 1
        [lost] = run.lost_workers
        assert lost["worker"] == victim.address and lost["rank"] == 1 and 0 < lost["step"] < 400  # from a snapshot
        assert result["steps"] == 400 and result["samples"] == clean["samples"] == 400 * 128  # same global batch
        assert result["val_nll"] == pytest.approx(clean["val_nll"], abs=0.03)
        steps = [m["step"] for m in store.metrics(handle.run_id, kind="train") if m["rank"] == 0]
        assert steps == list(range(1, 401))  # one continuous curve: steps after the snapshot were trained again
    finally:
        shutdown(client)


@pytest.mark.slow  # a long end-to-end path: the full suite's, not the edit loop's
def test_a_resumed_run_that_loses_a_worker_before_its_first_snapshot_re_forms_from_where_it_resumed(
        corpus, tmp_path: Path):
    from petmodel.resume import prepare_resume

    store = RunStore(tmp_path)
    client = start_local_cluster(2, 1)
    try:
        first = launch_run(client, tiny_spec(max_steps=100, batch_size=64, checkpoint_every_s=0).with_(workers=2),
                           store, corpus=corpus).wait(120)
        spec, resume = prepare_resume(store, first["run_id"], max_steps=300, checkpoint_every_s=600.0)
        pids = {w.address: w.pid for w in describe_workers(client)}
        handle = launch_run(client, spec, store, corpus=corpus, resume=resume, pg_timeout_s=5)
        deadline = time.monotonic() + 60
        while handle.last_step < 130 and time.monotonic() < deadline and not handle.done():
            time.sleep(0.05)
        assert not handle.done() and handle.snapshot_step == 100  # killed before any snapshot of its own
        os.kill(pids[handle.worker_addresses[1]], signal.SIGKILL)
        result = handle.wait(120)
        run = store.get_run(handle.run_id)
        assert result["status"] == "completed" and run.restarts == 1, run.error
        assert run.lost_workers[0]["step"] == 100  # back to where it resumed, not to step 0
        steps = [m["step"] for m in store.metrics(handle.run_id, kind="train") if m["rank"] == 0]
        assert steps == list(range(1, 301))  # the copied first 100 steps are kept, the rest trained once
    finally:
        shutdown(client)


def test_wandb_offline_logs_and_online_needs_credentials(cluster, corpus, tmp_path: Path, monkeypatch):
    store = RunStore(tmp_path / "store")
    handle = launch_run(cluster, tiny_spec().with_(workers=1, wandb_mode="offline"), store, corpus=corpus)
    result = handle.wait(120)
    runs = list((tmp_path / "store" / "wandb").glob(f"offline-run-*-{result['run_id']}"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    before = len(store.list_runs())
    with pytest.raises(PetmodelError, match="W&B online mode needs credentials"):
        launch_run(cluster, tiny_spec().with_(workers=1, wandb_mode="online"), store, corpus=corpus)
    assert len(store.list_runs()) == before


def test_bf16_on_the_cluster_is_decided_by_the_workers_that_would_train(cluster, corpus, tmp_path: Path):
    """Where the workers' CPUs have no bf16 LSTM, the launch is refused naming one, before a run is recorded."""
    from petmodel.errors import UnsupportedPrecision
    from petmodel.precision import bf16_supported

    store = RunStore(tmp_path)
    spec = tiny_spec(precision="bf16").with_(workers=2)
    if bf16_supported("cpu"):  # the workers run on this machine's CPU
        assert launch_run(cluster, spec, store, corpus=corpus).wait(120)["status"] == "completed"
        return
    with pytest.raises(UnsupportedPrecision, match=r"^bf16 precision does not run on worker tcp://127\.0\.0\.1:\d+'s "
                                                  r"CPU \(\w+: no AVX-512 BF16 or AMX\); choose fp32 precision\.$"):
        launch_run(cluster, spec, store, corpus=corpus)
    assert store.list_runs() == []
    assert launch_run(cluster, tiny_spec().with_(workers=2), store, corpus=corpus).wait(120)["status"] == "completed"
