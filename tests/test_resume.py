"""Snapshots of the training state, and runs continued from them (in this process and from the CLI)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from petmodel.config import RunSpec, TrainConfig
from petmodel.errors import PetmodelError
from petmodel.resume import prepare_resume, resumable
from petmodel.runner import train_in_process
from petmodel.store import RunStore
from petmodel.train import train_model
from petmodel.trainstate import TrainState, load_state

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(hidden=32, embed=16, dropout=0.2)  # dropout on: resumed masks must match too


def _train(corpus, config: TrainConfig, **kwargs):
    train_data, val_data = corpus.encode_splits()
    spec = RunSpec(train=config, **SMALL)
    return train_model(spec.model_config(corpus.alphabet.vocab_size), config, train_data, val_data, **kwargs)


# 6 batches an epoch of the 13,391 training pairs: stops at 7 and 11 fall mid-epoch, after and before a boundary
RESUME_CONFIG = TrainConfig(max_seconds=None, max_steps=16, batch_size=2048, lr=0.01, eval_every_steps=5)


@pytest.fixture(scope="module")
def uninterrupted(corpus):
    """The run of ``RESUME_CONFIG`` without a stop: what every resumed run is compared with (trained once)."""
    return _train(corpus, RESUME_CONFIG)


@pytest.mark.parametrize("stop_at", [7, 11])  # mid-epoch, and not on a validation step
def test_resumed_run_ends_with_the_weights_of_the_uninterrupted_run(corpus, uninterrupted, stop_at: int) -> None:
    config, whole = RESUME_CONFIG, uninterrupted
    first = _train(corpus, TrainConfig(**{**config.to_dict(), "max_steps": stop_at}))
    assert first.state is not None and first.state.step == stop_at
    state = TrainState.from_bytes(first.state.to_bytes())  # through bytes, as a snapshot travels
    rest = _train(corpus, config, resume=state)
    assert rest.steps == whole.steps == 16
    for name, tensor in whole.final_state.items():
        torch.testing.assert_close(rest.final_state[name], tensor, rtol=1e-5, atol=1e-6)
    # The stopped run also validated where it stopped; every validation of the whole run is there too.
    assert {h["step"] for h in whole.history} <= {h["step"] for h in rest.history} == \
        {h["step"] for h in whole.history} | {stop_at}
    assert rest.best_val_nll <= whole.best_val_nll + 1e-6
    assert rest.global_samples == whole.global_samples


@pytest.mark.slow  # a long end-to-end path: the full suite's, not the edit loop's
def test_an_epoch_boundary_snapshot_resumes_into_the_next_epoch(corpus) -> None:
    n_batches = len(corpus.train_names) // 8192
    config = TrainConfig(max_seconds=None, epochs=2, batch_size=8192, lr=0.01)
    whole = _train(corpus, config)
    first = _train(corpus, TrainConfig(**{**config.to_dict(), "epochs": 1}))
    assert (first.state.epoch, first.state.batch, first.state.step) == (1, 0, n_batches)
    rest = _train(corpus, config, resume=first.state)
    for name, tensor in whole.final_state.items():
        torch.testing.assert_close(rest.final_state[name], tensor, rtol=1e-5, atol=1e-6)


def test_periodic_snapshots_are_saved_and_a_run_resumes_as_a_new_linked_run(corpus, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store")
    spec = RunSpec(train=TrainConfig(max_seconds=None, max_steps=12, batch_size=2048, lr=0.01,
                                     checkpoint_every_s=1e-9), **SMALL)  # a snapshot after every step
    seen: list[int] = []
    from petmodel import runner

    original = runner.save_snapshot

    def spy(store_, run_id, spec_, state):
        if isinstance(state, TrainState):
            seen.append(state.step)
        original(store_, run_id, spec_, state)

    runner.save_snapshot = spy
    try:
        first = train_in_process(spec, store, corpus=corpus)
    finally:
        runner.save_snapshot = original
    assert seen[:-1] == list(range(1, 13)) and seen[-1] == 12  # every step, then the final one
    state, _ = load_state(store.state_path(first["run_id"]))
    assert state.step == 12 and state.spec["train"]["max_steps"] == 12
    assert resumable(store, first["run_id"])

    with pytest.raises(PetmodelError, match="already trained its 12 steps"):
        prepare_resume(store, first["run_id"])
    spec2, resume = prepare_resume(store, first["run_id"], max_steps=20)
    second = train_in_process(spec2, store, corpus=corpus, resume=resume)
    record = store.get_run(second["run_id"])
    assert record.resumed_from == first["run_id"] and record.status == "completed"
    steps = [m["step"] for m in store.metrics(second["run_id"], kind="train")]
    assert steps == list(range(1, 21))  # the old run's curve, then the new steps: one curve
    assert second["steps"] == 20


def test_resume_refuses_what_cannot_continue(corpus, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store")
    with pytest.raises(PetmodelError, match="No run called 'nope'"):
        prepare_resume(store, "nope")
    running = store.create_run(RunSpec().to_dict(), status="running")
    with pytest.raises(PetmodelError, match="still running"):
        prepare_resume(store, running)
    store.update_run(running, status="failed")
    with pytest.raises(PetmodelError, match="left no training snapshot"):
        prepare_resume(store, running)
    store.state_path(running).parent.mkdir(parents=True, exist_ok=True)
    store.state_path(running).write_bytes(b"not a snapshot")
    with pytest.raises(PetmodelError, match="damaged"):
        prepare_resume(store, running)
    from test_model import _Evil  # a pickle that runs a command when loaded

    _Evil.marker = tmp_path / "ran"
    torch.save({"format": "x", "evil": _Evil()}, store.state_path(running))  # a snapshot swapped
    with pytest.raises(PetmodelError, match=r"^The training snapshot \S+ asks to run code, .*: it was not loaded"):
        prepare_resume(store, running)
    assert not _Evil.marker.exists()


def _cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "petmodel", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_interrupted_cli_leaves_a_snapshot_that_resume_continues(tmp_path: Path, capsys) -> None:
    sig = signal.SIGINT  # SIGTERM takes the same handler: test_sigterm_stops_the_cli_cleanly
    store_dir = tmp_path / "store"
    common = ["--store", str(store_dir), "--hidden", "32", "--json"]
    proc = _cli("train", "--max-seconds", "120", "--checkpoint-every", "60", *common)
    store = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if store_dir.exists():
            store = RunStore(store_dir)
            runs = store.list_runs()
            if runs and len(store.metrics(runs[0].id, kind="train")) > 3:
                break
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    [run] = store.list_runs()
    assert run.status == "cancelled", run
    state, _ = load_state(store.state_path(run.id))  # written at the stop, not at the 60 s tick
    assert state.step >= 3
    assert "resume" in err.lower() and run.id in err

    # The resume itself needs no process of its own: main() here (the stop above was the real process's).
    from petmodel.cli import main

    capsys.readouterr()
    code = main(["train", "--resume", run.id, "--max-seconds", "1", *common])
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    result = json.loads(out)  # with --json, stdout is that one JSON object
    new = store.get_run(result["run_id"])
    assert new.resumed_from == run.id and new.status == "completed"
    assert result["steps"] > state.step
    first_new = [m for m in store.metrics(new.id, kind="train") if m["step"] == state.step + 1]
    assert first_new and first_new[0]["elapsed"] >= state.elapsed  # the curve continues in time too


def test_sigterm_stops_the_cli_cleanly(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    proc = _cli("train", "--max-seconds", "120", "--checkpoint-every", "0", "--store", str(store_dir),
                "--hidden", "32", "--quiet")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
            store_dir.exists() and any(RunStore(store_dir).metrics(r.id) for r in RunStore(store_dir).list_runs())):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "--resume" in err, err[-2000:]
    [run] = RunStore(store_dir).list_runs()
    assert run.status == "cancelled" and load_state(RunStore(store_dir).state_path(run.id))[0].step > 0


def test_a_snapshot_waits_for_the_metric_rows_up_to_its_step(tmp_path: Path) -> None:
    """The collector writes a snapshot only once the store's rows reach its step (else a client killed in
    between leaves a snapshot ahead of its curve, and the resumed curve has a gap), and never holds one
    back for good. A real Dask queue on an in-process cluster."""
    import distributed

    from petmodel.cluster import snapshot_collector
    from petmodel.cluster.snapshot_collector import SnapshotCollector
    from petmodel.config import DEFAULT_SPEC
    from petmodel.store import RunStore

    store = RunStore(tmp_path / "store")
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as lc, \
            distributed.Client(lc) as client:
        collector = SnapshotCollector(store, "run-1", DEFAULT_SPEC, "snapshots-run-1")
        collector.open(client)
        queue, path = distributed.Queue("snapshots-run-1", client=client), store.state_path("run-1")
        queue.put({"step": 40, "elapsed": 1.0, "blob": b"forty"})
        collector.collect(stored_step=30)  # rows only up to step 30 are stored: held back
        assert not path.exists() and collector.newest is None
        queue.put({"step": 20, "elapsed": 0.5, "blob": b"twenty"})  # an older one changes nothing
        collector.collect(stored_step=39)
        assert not path.exists()
        collector.collect(stored_step=40)  # the rows caught up
        assert path.read_bytes() == b"forty" and collector.newest.step == 40
        queue.put({"step": 50, "elapsed": 2.0, "blob": b"fifty"})
        collector.collect(stored_step=45)
        collector._held_since -= snapshot_collector.HOLD_MAX_S + 1  # rows that never come: written anyway
        collector.collect(stored_step=45)
        assert path.read_bytes() == b"fifty"
        queue.put({"step": 60, "elapsed": 3.0, "blob": b"sixty"})
        collector.close()  # the run ended: what is left is written
        assert path.read_bytes() == b"sixty"


@pytest.mark.slow  # a long end-to-end path: the full suite's, not the edit loop's
def test_a_cli_killed_mid_run_again_and_again_leaves_a_sound_store(tmp_path: Path, capsys) -> None:
    """SIGKILL gives no handler a chance: the next reader marks the run failed, the database stays sound,
    and the store still trains (a kill can land in a metrics write, a snapshot write or a commit)."""
    import sqlite3

    from petmodel.cli import main

    store_dir = tmp_path / "store"
    common = ["--store", str(store_dir), "--hidden", "32", "--quiet"]
    for round_, extra_wait in enumerate((0.0, 0.3, 0.7)):
        proc = _cli("train", "--max-seconds", "120", "--checkpoint-every", "0.2", *common)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until this round's run (the newest) has a metric row
                time.sleep(0.1)
                store = RunStore(store_dir) if store_dir.exists() else None
                runs = store.list_runs() if store else []
                if len(runs) > round_ and store.metrics(runs[0].id, kind="train"):
                    break
            time.sleep(extra_wait)  # mid-run, at a different point each round
        finally:
            proc.kill()
            proc.wait(30)
        assert proc.returncode == -signal.SIGKILL
        code = main(["runs", "--json", "--store", str(store_dir)])  # what any reader does first: reconcile
        assert code == 0
        listed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["runs"]
        assert len(listed) == round_ + 1
        assert all(r["status"] == "failed" and "stopped before it finished" in r["error"] for r in listed), listed
    with sqlite3.connect(store_dir / "runs.sqlite") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    code = main(["train", "--max-seconds", "1", *common])  # the store still takes a run to the end
    assert code == 0
    assert [r.status for r in RunStore(store_dir).list_runs()].count("completed") == 1
