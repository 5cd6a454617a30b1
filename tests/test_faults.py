"""Faults that must end in one sentence of ours with nothing stranded (issue 41, part 2): a killed scheduler, ranks
whose driver is gone, results that never arrive.

A real ``dask scheduler`` and two ``dask worker`` processes on loopback, a 2-worker ``python -m petmodel train``
against them, and ``kill -9`` of the scheduler once the run has a snapshot.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from petmodel.errors import PetmodelError
from petmodel.cluster.failures import FailureKind, RankFailure, failure_sentence, lost_the_scheduler
from petmodel.store import RunStore

REPO = Path(__file__).resolve().parents[1]


def test_what_counts_as_a_lost_scheduler() -> None:
    from types import SimpleNamespace

    def client(status: str) -> SimpleNamespace:
        return SimpleNamespace(status=status)

    assert lost_the_scheduler(ValueError("x"), client("closed"))  # the client gave up on it, whatever was raised
    assert lost_the_scheduler(ValueError("x"), client("connecting"))
    assert lost_the_scheduler(concurrent.futures.CancelledError(), client("running"))  # Dask cancels every future
    assert lost_the_scheduler(TimeoutError("timed out after 10 s"), client("running"))  # a frozen scheduler
    assert lost_the_scheduler(ConnectionResetError(), None)
    assert not lost_the_scheduler(KeyError("a bug of ours"), client("running"))
    sentence = failure_sentence(RankFailure(FailureKind.SCHEDULER_LOST, worker="tcp://h:1", detail="resume it."))
    assert sentence == "Lost the Dask scheduler at tcp://h:1 (it stopped, restarted or stopped answering); resume it."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Cluster:
    """A real ``dask scheduler`` and two single-threaded ``dask worker`` processes on loopback, each in a session of
    its own (so a signal reaches the whole process), and a 2-worker ``petmodel train`` CLI against them. ``wrap``
    prefixes every command (``ip netns exec NS``: all of it in a network namespace)."""

    def __init__(self, tmp_path: Path, wrap: list[str] | None = None) -> None:
        self.wrap = list(wrap or [])
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.store_dir = tmp_path / "store"
        self.env = {**os.environ, "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "500ms"}
        self.procs = [self._spawn(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                   "--no-dashboard"])]
        self.procs += [self._spawn(["distributed.cli.dask_worker", self.address, "--nthreads", "1", "--no-dashboard",
                                    "--death-timeout", "30"]) for _ in range(2)]
        self.cli: subprocess.Popen | None = None

    def _spawn(self, args: list[str]) -> subprocess.Popen:
        return subprocess.Popen([*self.wrap, sys.executable, "-m", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=self.env, start_new_session=True)

    def train(self, seconds: int) -> str:
        """Start the CLI; the id of its run once it has a snapshot."""
        self.cli = subprocess.Popen([*self.wrap, sys.executable, "-m", "petmodel", "train", "--workers", "2", "--scheduler",
                                     self.address, "--max-seconds", str(seconds), "--hidden", "32", "--embed", "8",
                                     "--checkpoint-every", "1", "--store", str(self.store_dir), "--quiet", "--json"],
                                    cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline, snapshot = time.monotonic() + 90, None
        while snapshot is None and time.monotonic() < deadline and self.cli.poll() is None:
            time.sleep(0.3)
            if self.store_dir.exists():
                store = RunStore(self.store_dir)
                snapshot = next((r.id for r in store.list_runs() if store.state_path(r.id).is_file()), None)
        if snapshot is None:
            self.cli.kill()
            pytest.fail(f"the run never sent a snapshot: {self.cli.communicate()[1][-2000:]}")
        return snapshot

    def signal_scheduler(self, sig: int) -> None:
        os.killpg(self.procs[0].pid, sig)

    def worker_cores(self, seconds: float) -> float:
        """Cores the workers' sessions (each worker, its nanny's children, the forkserver's) used over ``seconds``."""
        sessions = {p.pid for p in self.procs[1:]}

        def ticks() -> int:
            total = 0
            for stat in Path("/proc").glob("[0-9]*/stat"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = stat.read_text().rsplit(")", 1)[1].split()
                    if int(fields[3]) in sessions:  # the session id
                        total += int(fields[11]) + int(fields[12])  # utime + stime
            return total

        before = ticks()
        time.sleep(seconds)
        return (ticks() - before) / os.sysconf("SC_CLK_TCK") / seconds

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGCONT)
                    os.killpg(p.pid, signal.SIGKILL)
        if self.cli is not None and self.cli.poll() is None:
            self.cli.kill()


@pytest.mark.slow
@pytest.mark.parametrize("restart", [False, True], ids=["killed", "restarted"])
def test_a_killed_scheduler_ends_the_run_in_one_sentence_and_it_resumes(tmp_path, restart: bool) -> None:
    """Killed, or killed and started again on the same port (the client reconnects to a scheduler that never
    heard of the run): either way the run ends in our sentence, and the workers, which leave with their
    scheduler, take the ranks with them."""
    lab = _Cluster(tmp_path)
    try:
        snapshot = lab.train(30)
        lab.signal_scheduler(signal.SIGKILL)
        killed = time.monotonic()
        if restart:
            lab.procs[0].wait(10)
            lab.procs[0] = lab._spawn(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                                       str(lab.port), "--no-dashboard"])
        out, err = lab.cli.communicate(timeout=60)
        elapsed = time.monotonic() - killed
        time.sleep(3)
        cores = lab.worker_cores(3)
    finally:
        lab.close()
    print(f"the CLI ended {elapsed:.1f} s after the scheduler was killed; the workers then used {cores:.2f} cores")
    assert lab.cli.returncode == 1 and elapsed < 30 and cores < 0.5
    ours = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "Traceback" not in err, err[-2000:]
    assert ours[0].startswith(f"error: Lost the Dask scheduler at {lab.address} (it stopped, restarted or stopped "
                              "answering); the run stopped at step ")
    assert f"--resume {snapshot}` once a scheduler is back." in ours[0]
    run = RunStore(lab.store_dir).get_run(snapshot)
    assert run.status == "failed" and run.error == ours[0].removeprefix("error: ")  # recorded, never left running
    resumed = subprocess.run([sys.executable, "-m", "petmodel", "train", "--resume", snapshot, "--max-seconds", "2",
                              "--store", str(lab.store_dir), "--quiet", "--json"], cwd=REPO, capture_output=True,
                             text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["status"] == "completed" and result["resumed_from"] == snapshot


@pytest.mark.slow
def test_ranks_whose_driver_is_gone_stop_instead_of_training_for_nobody(tmp_path) -> None:
    """The CLI killed mid-run (or a client the scheduler lost: a frozen scheduler that thaws after the CLI gave
    up): the scheduler releases the ranks' tasks, and the ranks stop within a second or two. Before, they trained
    on for the rest of their budget (1.8 cores for 17 s after a 36 s freeze), slowing every run after."""
    lab = _Cluster(tmp_path)
    try:
        lab.train(60)
        lab.cli.send_signal(signal.SIGKILL)  # no cleanup of its own: only the scheduler knows it is gone
        lab.cli.wait(timeout=10)
        time.sleep(5)  # the scheduler notices, releases the tasks; the ranks see it and agree to stop
        alive = [p.poll() is None for p in lab.procs]
        cores = lab.worker_cores(5)
    finally:
        lab.close()
    print(f"with the driver gone the workers used {cores:.2f} cores")
    assert alive == [True, True, True]  # so the cores are the ranks', not dead workers'
    assert cores < 0.5, f"the ranks still train for nobody: {cores:.2f} cores"


def test_an_empty_resume_and_an_overlong_path_are_one_sentence_each(tmp_path, capsys) -> None:
    from petmodel.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["train", "--resume", "", "--store", str(tmp_path / "s")])  # "$RUN" unset: never a new run
    assert exit_.value.code == 2 and "a run id is needed, got an empty one" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    long = str(tmp_path / ("b" * 300) / "store")
    assert main(["runs", "--store", long]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: The path ") and "(File name too long)" in err
    RunStore(tmp_path / "s2")
    assert main(["generate", "--model", "a" * 300, "--store", str(tmp_path / "s2")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be used (File name too long)" in err and "Traceback" not in err


def test_a_malformed_scaling_setting_is_said_on_the_cluster_page(tmp_path, monkeypatch) -> None:
    """``PETMODEL_SCALE_GRACE_S=abc`` used to be swallowed where the app attaches its scaler: the cluster just
    never grew. The Cluster page now says which setting is wrong and what it should be."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("PETMODEL_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("PETMODEL_WARMUP", "0")
    monkeypatch.delenv("PETMODEL_ADMIN_PASSWORD", raising=False)
    for name, value in (("PETMODEL_SCALE_GRACE_S", "abc"), ("PETMODEL_SCALE_MAX_WORKERS", "-1")):
        with monkeypatch.context() as env:
            env.setenv(name, value)
            at = AppTest.from_file(str(REPO / "streamlit_app.py"), default_timeout=30)
            at.switch_page("pages/cluster.py").run()
            assert not at.exception
            [warning] = [w.value for w in at.warning if name in w.value]
            assert f"${name} must be" in warning and repr(value) in warning and "cannot grow" in warning
    at = AppTest.from_file(str(REPO / "streamlit_app.py"), default_timeout=30)
    at.switch_page("pages/cluster.py").run()
    assert not [w for w in at.warning if "PETMODEL_SCALE" in w.value]


def test_results_that_never_arrive_are_one_sentence_not_a_hang(cluster) -> None:
    """A network that drops large messages (an MTU black hole) never delivers rank 0's result: fetching it is
    bounded, and the supervisor fails the run with this sentence instead of waiting forever."""
    from petmodel.cluster.rank_group import RankGroup
    from petmodel.cluster.workers import describe_workers
    from petmodel.errors import PetmodelError

    worker = describe_workers(cluster)[0]
    group = RankGroup(cluster, "no-run", [worker])
    group.futures = [cluster.submit(time.sleep, 30, workers=[worker.address], pure=False)]
    started = time.monotonic()
    try:
        with pytest.raises(PetmodelError) as err:
            group.results(timeout=0.5)
    finally:
        cluster.cancel(group.futures, force=True)
    assert time.monotonic() - started < 5
    text = str(err.value)
    assert text.startswith(f"Rank 0's result did not arrive from worker {worker.address} within 0.5 s"), text
    assert "\n" not in text and "resume it" in text


class _Lock:
    """Another process's hold on the run store (``BEGIN EXCLUSIVE`` on its own connection), from ``start`` s after
    it is started for ``hold`` s, on a thread."""

    def __init__(self, db: Path, start: float, hold: float) -> None:
        import sqlite3
        import threading

        self.held = threading.Event()

        def hold_it() -> None:
            time.sleep(start)
            conn = sqlite3.connect(db, isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            self.held.set()
            time.sleep(hold)
            conn.execute("ROLLBACK")
            conn.close()

        self.thread = threading.Thread(target=hold_it, daemon=True)
        self.thread.start()


@pytest.fixture
def impatient_store(monkeypatch):
    """The store gives up on a lock after 0.2 s (not 10), and a run on a refusing store after 3 s (not 60)."""
    import petmodel.cluster.supervisor as supervisor
    import petmodel.store.connection as connection

    monkeypatch.setattr(connection, "BUSY_TIMEOUT_MS", 200)
    monkeypatch.setattr(supervisor, "STORE_GRACE_S", 3.0)
    monkeypatch.setattr(supervisor, "RECORD_RETRY_S", 0.5)


def _two_worker_run(cluster, corpus, store: RunStore, seconds: float):
    from petmodel.cluster.launch import launch_run
    from petmodel.config import RunSpec, TrainConfig

    spec = RunSpec(train=TrainConfig(max_seconds=seconds, batch_size=16, lr=0.01, eval_every_seconds=0.5,
                                     checkpoint_every_s=1.0),
                   hidden=16, embed=8, dropout=0.0).with_(workers=2)
    return launch_run(cluster, spec, store, corpus=corpus)


@pytest.mark.slow  # a 5 s run on the cluster
def test_a_store_locked_for_a_while_loses_no_row_and_the_run_completes(cluster, corpus, tmp_path, impatient_store):
    """Locked for 2 s mid-run (ten times the store's patience, within the run's): the rows wait and are written,
    and the run completes; before, the first refused write failed the run."""
    store = RunStore(tmp_path)
    handle = _two_worker_run(cluster, corpus, store, seconds=5)
    lock = _Lock(store.root / "runs.sqlite", start=1.5, hold=2.0)
    result = handle.wait(120)
    assert lock.held.is_set()
    assert result["status"] == "completed", result
    steps = [m["step"] for m in store.metrics(handle.run_id, kind="train") if m.get("rank") == 0]
    assert steps == list(range(1, result["steps"] + 1))  # every step's row, in order, none lost or doubled
    assert store.get_run(handle.run_id).status == "completed"


@pytest.mark.slow  # a run on the cluster, then a wait for the lock to go
def test_a_store_locked_past_the_runs_patience_fails_it_in_one_sentence_and_records_it(cluster, corpus, tmp_path,
                                                                                       impatient_store):
    """Locked for 8 s from 2.5 s in (past the 3 s grace): the run fails in one sentence with its snapshot kept,
    and once the lock goes its record is final (an app's run never stays "running")."""
    store = RunStore(tmp_path)
    handle = _two_worker_run(cluster, corpus, store, seconds=30)
    lock = _Lock(store.root / "runs.sqlite", start=2.5, hold=8.0)  # after the first snapshot (every second)
    with pytest.raises(PetmodelError) as raised:
        handle.wait(120)
    error = str(raised.value)
    assert error.startswith("The run store could not record the run for 3 s, so it was stopped (resume it with "
                            f"`python -m petmodel train --resume {handle.run_id}` once the store takes writes): "
                            "The run store ") and "stayed locked" in error and "\n" not in error, error
    lock.thread.join(20)
    deadline = time.monotonic() + 20
    while store.get_run(handle.run_id).status == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    record = store.get_run(handle.run_id)
    assert (record.status, record.error) == ("failed", error)
