"""Runs whose driver stopped on another host (issue 41): failed once their heartbeat is stale, and
`runs delete --force` for the ones nobody can vouch for.

The end-to-end test trains a real CLI under another host name (``unshare --uts``), kills it with
SIGKILL after its first snapshot and checks what this host makes of the run it left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from petmodel.errors import PetmodelError, UsageError
from petmodel.store import RunStore, current_owner
from petmodel.store.owners import stale_for

REPO = Path(__file__).resolve().parents[1]
OTHER_HOST = "petmodel-other-host"
TINY = ("--hidden", "16", "--embed", "8", "--quiet")


def test_only_a_silent_driver_on_another_host_is_stale() -> None:
    here, now = "this-host", 10_000.0
    assert stale_for("this-host:123", 0.0, now, 600, here=here) is None  # the OS answers for local owners
    assert stale_for("that-host:123", now - 599, now, 600, here=here) is None  # quiet, not yet stale
    assert stale_for("that-host:123", now - 601, now, 600, here=here) == 601
    assert stale_for("that-host:123", now - 600, now, 600, here=here) is None  # the bound itself is not past it
    for unreadable in (None, "", "garbage", "host:", ":12", "host:pid"):  # nobody to ask: the heartbeat decides
        assert stale_for(unreadable, now - 700, now, 600, here=here) == 700
        assert stale_for(unreadable, now - 5, now, 600, here=here) is None


def test_the_reaper_goes_by_the_newest_heartbeat_and_spares_live_local_work(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PETMODEL_STALE_RUN_S", "60")
    store = RunStore(tmp_path / "store")
    long_ago = time.time() - 3600

    def run(owner: str | None, **fields) -> str:
        run_id = store.create_run({}, status="running", owner=owner)
        store.update_run(run_id, **{"created": long_ago, "started": long_ago, **fields})
        return run_id

    silent = run("gone-host:41")
    store.add_metrics(silent, [{"step": 1, "recorded": long_ago + 30}])
    store.state_path(silent).write_bytes(b"a snapshot")
    no_snapshot = run("gone-host:42")
    reporting = run("busy-host:43")
    store.add_metrics(reporting, [{"step": 1}])  # just now: a live driver elsewhere
    resumed = run("busy-host:44", started=time.time())  # its copied curve is old, its start is not
    store.add_metrics(resumed, [{"step": 1, "recorded": long_ago}])
    mine = run(current_owner())  # this process: alive, however quiet
    queued = store.create_run({}, status="queued", owner="gone-host:45")
    store.update_run(queued, created=long_ago)

    assert sorted(store.reconcile_orphans()) == sorted([silent, no_snapshot, queued])
    failed = store.get_run(silent)
    assert failed.status == "failed" and failed.finished == pytest.approx(long_ago + 30)  # ended when it went quiet
    assert failed.error.startswith("The process driving this run (host gone-host, pid 41) stopped reporting "
                                   "59 min 3")  # 3,570 s
    assert failed.error.endswith(f"`python -m petmodel train --resume {silent}`, or delete it.")
    assert store.get_run(no_snapshot).error.endswith(
        f"; delete it with `python -m petmodel runs delete {no_snapshot}`.")
    for kept in (reporting, resumed, mine):
        assert store.get_run(kept).status == "running" and store.get_run(kept).error is None
    assert store.reconcile_orphans() == []


def test_a_study_driven_from_another_host_fails_once_nothing_of_it_moves(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PETMODEL_STALE_RUN_S", "60")
    store = RunStore(tmp_path / "store")
    long_ago = time.time() - 3600

    def study(with_run: str, finished: float | None = None, reported: bool = False) -> str:
        study_id = store.create_study({"owner": "gone-host:7"}, kind="sweep")
        run_id = store.create_run({}, status=with_run, owner="gone-host:7", study_id=study_id)
        store.update_run(run_id, created=long_ago, started=long_ago, finished=finished)
        if reported:
            store.add_metrics(run_id, [{"step": 1}])
        with store._write() as conn:  # a study row has no setter for its creation time
            conn.execute("UPDATE studies SET created = ? WHERE id = ?", (long_ago, study_id))
        return study_id

    idle = study("completed", finished=long_ago + 60)
    stalled = study("running")  # its run is stale too: both fail, in one pass
    between_trials = study("completed", finished=time.time() - 5)  # a trial just ended: the next one comes
    long_trial = study("running", reported=True)  # started long ago, reporting still: its study lives
    reaped = store.reconcile_orphans()
    assert idle in reaped and stalled in reaped and between_trials not in reaped and long_trial not in reaped
    assert store.get_study(idle).error.startswith("The process driving this study (host gone-host, pid 7) stopped "
                                                  "reporting 59 min 0")
    assert store.get_study(idle).error.endswith(
        "ago; its finished runs are kept, and the Experiments page can delete it.")
    assert store.get_study(between_trials).status == store.get_study(long_trial).status == "running"


def test_a_bad_staleness_bound_is_one_sentence_after_local_orphans_are_reaped(tmp_path: Path, monkeypatch,
                                                                               capsys) -> None:
    from petmodel.cli import main

    store = RunStore(tmp_path / "store")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    orphan = store.create_run({}, status="running", owner=f"{socket.gethostname()}:{dead}")
    monkeypatch.setenv("PETMODEL_STALE_RUN_S", "10 min")
    with pytest.raises(UsageError) as info:
        store.reconcile_orphans()
    assert str(info.value) == ("$PETMODEL_STALE_RUN_S must be a number of seconds above 0, not '10 min'; fix it, "
                               "or unset it for the default.")
    assert store.get_run(orphan).status == "failed"
    assert main(["runs", "--store", str(store.root)]) == 2
    assert capsys.readouterr().err == f"error: {info.value}\n"


def test_force_deletes_runs_nobody_here_drives_but_never_a_live_local_one(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store")
    mine = store.create_run({}, status="running", owner=current_owner())
    elsewhere = store.create_run({}, status="running", owner="other-host:99")
    with pytest.raises(PetmodelError) as info:
        store.delete_runs([mine, elsewhere], force=True)  # all or nothing
    assert str(info.value) == (f"Run {mine} is still being trained by process {os.getpid()} on this host; cancel it "
                               "(Ctrl-C in its terminal, or Cancel run on the Train page) and wait until it stops "
                               "before deleting it.")
    with pytest.raises(PetmodelError, match=r"delete it anyway with `python -m petmodel runs delete --force "):
        store.delete_runs([elsewhere])
    assert store.get_run(elsewhere) is not None
    assert store.delete_runs([elsewhere], force=True) == [elsewhere] and store.get_run(elsewhere) is None
    assert store.get_run(mine).status == "running"


def _can_rename_host() -> str | None:
    """Why this machine cannot run a process under another host name (``unshare --uts``), or None."""
    if shutil.which("unshare") is None:
        return "needs `unshare` (util-linux) to run a process under another host name"
    try:
        probe = subprocess.run(["unshare", "--uts", "sh", "-c", f"hostname {OTHER_HOST} && hostname"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"`unshare --uts` did not run ({err})"
    if probe.returncode != 0 or probe.stdout.strip() != OTHER_HOST:
        return f"`unshare --uts` cannot rename the host here (needs root or user namespaces): {probe.stderr.strip()}"
    return None


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petmodel", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def _runs(store_dir: Path, **env: str) -> dict[str, dict]:
    """``runs --json`` from a real process on this host (which reconciles first), by run id."""
    done = _cli("runs", "--json", "--store", str(store_dir), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return {r["run_id"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])["runs"]}


@pytest.mark.slow  # two trainings in real processes, one under another host name
def test_a_run_whose_driver_died_on_another_host_is_failed_once_stale_then_resumes(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    why = _can_rename_host()
    if why:
        pytest.skip(why)
    monkeypatch.delenv("PETMODEL_STALE_RUN_S", raising=False)
    store_dir = tmp_path / "store"
    train = " ".join([sys.executable, "-m", "petmodel", "train", "--max-seconds", "120", "--checkpoint-every", "0.2",
                      "--store", str(store_dir), *TINY])
    proc = subprocess.Popen(["unshare", "--uts", "sh", "-c", f"hostname {OTHER_HOST} && exec {train}"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, run = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            runs = RunStore(store_dir).list_runs() if (store_dir / "runs.sqlite").is_file() else []
            if runs and RunStore(store_dir).state_path(runs[0].id).is_file():
                run = runs[0]
                break
    finally:
        proc.kill()  # SIGKILL: no handler records anything; exec made the trainer this very pid
        _, err = proc.communicate(timeout=30)
    assert run is not None, err[-2000:]
    assert proc.returncode == -signal.SIGKILL
    store = RunStore(store_dir)
    assert store.get_run(run.id).owner == f"{OTHER_HOST}:{proc.pid}"

    # Fresh: this host cannot ask another host's process, so the run stays running.
    assert _runs(store_dir)[run.id]["status"] == "running"
    refused = _cli("runs", "delete", run.id, "--store", str(store_dir))
    assert refused.returncode == 1 and refused.stderr == (
        f"error: Run {run.id} is still recorded running (host {OTHER_HOST}, pid {proc.pid}), and no process on this "
        f"host drives it; cancel it where it runs, or if its driver is gone delete it anyway with "
        f"`python -m petmodel runs delete --force {run.id}`.\n")
    refused = _cli("train", "--resume", run.id, "--max-seconds", "1", "--store", str(store_dir), *TINY)
    assert refused.returncode == 1 and "$PETMODEL_STALE_RUN_S" in refused.stderr, refused.stderr[-2000:]

    # --force, on a copy of the store as it is now: the run and its files go.
    forced_dir = tmp_path / "forced"
    shutil.copytree(store_dir, forced_dir)
    forced = _cli("runs", "delete", "--force", run.id, "--store", str(forced_dir), "--json")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert json.loads(forced.stdout.strip().splitlines()[-1])["deleted"] == [run.id]
    assert RunStore(forced_dir).get_run(run.id) is None and RunStore(forced_dir).metrics(run.id) == []
    assert not RunStore(forced_dir).state_path(run.id).exists() and store.state_path(run.id).is_file()

    # Stale: once it has been silent longer than the bound, any command on this host fails it.
    last = max([m["recorded"] for m in store.metrics(run.id)] + [store.get_run(run.id).started])
    time.sleep(max(0.0, last + 1.5 - time.time()))
    listed = _runs(store_dir, PETMODEL_STALE_RUN_S="1")[run.id]
    assert listed["status"] == "failed"
    assert listed["error"].startswith(f"The process driving this run (host {OTHER_HOST}, pid {proc.pid}) stopped "
                                      "reporting ")
    assert listed["error"].endswith(f" ago; resume it with `python -m petmodel train --resume {run.id}`, or delete it.")

    resumed = _cli("train", "--resume", run.id, "--max-seconds", "1", "--store", str(store_dir), "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    new = store.get_run(json.loads(resumed.stdout.strip().splitlines()[-1])["run_id"])
    assert new.resumed_from == run.id and new.status == "completed"
    assert new.owner.startswith(f"{socket.gethostname()}:")
