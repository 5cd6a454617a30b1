"""Tests for petmodel.store against real SQLite files (no mocks).

The concurrency test uses real processes because "database is locked" only shows up when
separate connections in separate processes contend for the write lock.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from petmodel.errors import PetmodelError
from petmodel.store.schema import SCHEMA_VERSION
from petmodel.store import (
    METRIC_COLUMNS,

    RunStore,
    current_owner,
    default_store_dir,
)

BATCHES = 200
ROWS_PER_BATCH = 5


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return RunStore(tmp_path / "store")


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_metrics(root: str, run_id: str, rank: int, start: multiprocessing.synchronize.Event) -> None:
    """Child process: many small batches, the pattern of a metrics-receiving thread."""
    store = RunStore(root)
    start.wait(30)
    for batch in range(BATCHES):
        store.add_metrics(
            run_id,
            [
                {"rank": rank, "step": batch * ROWS_PER_BATCH + i, "epoch": 0, "loss": 1.0 / (i + 1)}
                for i in range(ROWS_PER_BATCH)
            ],
        )


def test_layout_wal_and_schema_version(store: RunStore, tmp_path: Path) -> None:
    assert store.root == tmp_path / "store"
    assert store.db_path == store.root / "runs.sqlite"
    assert store.checkpoint_dir.is_dir()
    conn = sqlite3.connect(store.db_path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()
    # Opening again is idempotent and keeps the data.
    run_id = store.create_run({"a": 1})
    assert RunStore(store.root).get_run(run_id) is not None


def test_run_round_trip_with_json_fields(store: RunStore) -> None:
    config = {"hidden": 128, "lr": 0.01, "nested": {"layers": [1, 2]}}
    run_id = store.create_run(config, name="first", kind="trial", owner="h:1")
    assert len(run_id) == len("YYYYMMDD-HHMMSS-xxxx")
    date, clock, rand = run_id.split("-")
    assert date.isdigit() and clock.isdigit() and len(rand) == 4 and int(rand, 16) >= 0

    run = store.get_run(run_id)
    assert run is not None
    assert (run.config, run.name, run.kind, run.status, run.owner) == (config, "first", "trial", "queued", "h:1")
    assert run.workers == [] and run.hosts == [] and run.result is None
    assert not run.is_finished and run.duration is None

    store.update_run(
        run_id,
        status="completed",
        workers=("tcp://10.0.0.1:1", "tcp://10.0.0.2:2"),
        hosts=["a", "b"],
        result={"names": ["Rex", "Mia"], "loss": 0.5},
        started=100.0,
        finished=160.5,
        samples=1234,
        val_nll=1.5,
        best_val_nll=1.25,
        backend="gloo",
    )
    run = store.get_run(run_id)
    assert run is not None
    assert run.workers == ["tcp://10.0.0.1:1", "tcp://10.0.0.2:2"]
    assert run.hosts == ["a", "b"]
    assert run.result == {"names": ["Rex", "Mia"], "loss": 0.5}
    assert (run.samples, run.val_nll, run.best_val_nll, run.backend) == (1234, 1.5, 1.25, "gloo")
    assert run.is_finished and run.duration == pytest.approx(60.5)
    assert store.get_run("nope") is None


def test_status_and_field_validation(store: RunStore) -> None:
    with pytest.raises(ValueError, match="status"):
        store.create_run({}, status="done")
    run_id = store.create_run({})
    with pytest.raises(ValueError, match="status"):
        store.update_run(run_id, status="finished")
    with pytest.raises(ValueError, match="colour"):
        store.update_run(run_id, colour="red")
    with pytest.raises(ValueError):
        store.update_run(run_id, id="other")
    with pytest.raises(PetmodelError, match="No run called 'missing'"):
        store.update_run("missing", status="running")
    with pytest.raises(PetmodelError):
        store.update_run("missing")
    for status in ("queued", "running", "completed", "failed", "cancelled", "pruned"):
        store.update_run(run_id, status=status)
        assert store.get_run(run_id).status == status  # type: ignore[union-attr]


def test_list_runs_filters_and_orders_newest_first(store: RunStore) -> None:
    study = store.create_study({"grid": {"lr": [0.1, 0.01]}}, kind="sweep")
    first = store.create_run({}, kind="trial", study_id=study)
    second = store.create_run({}, kind="trial", study_id=study, status="running")
    third = store.create_run({})
    assert [r.id for r in store.list_runs()] == [third, second, first]
    assert [r.id for r in store.list_runs(study_id=study)] == [second, first]
    assert [r.id for r in store.list_runs(status="running")] == [second]
    assert [r.id for r in store.list_runs(kind="train")] == [third]
    assert [r.id for r in store.list_runs(limit=2)] == [third, second]
    assert len({first, second, third}) == 3


def test_metrics_incremental_polling(store: RunStore) -> None:
    run_id = store.create_run({})
    other = store.create_run({})
    assert store.metrics(run_id) == []
    store.add_metrics(run_id, [{"rank": 0, "step": s, "loss": 2.0 - s, "samples": 32 * s} for s in range(3)])
    store.add_metrics(other, [{"rank": 0, "step": 0, "loss": 9.0}])
    with pytest.raises(PetmodelError, match="No run called 'ghost'"):
        store.add_metrics("ghost", [{"rank": 0, "step": 0, "loss": 1.0}])

    rows = store.metrics(run_id)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["loss"] for r in rows] == [2.0, 1.0, 0.0]
    assert rows[0]["val_nll"] is None and rows[0]["samples_per_s"] is None and rows[0]["epoch"] is None
    assert rows[0]["kind"] == "train" and rows[0]["run_id"] == run_id
    assert rows[0]["id"] < rows[1]["id"] < rows[2]["id"]

    last = rows[-1]["id"]
    assert store.metrics(run_id, since_id=last) == []
    store.add_metrics(run_id, [{"rank": 1, "step": 3, "loss": 0.5}, {"rank": 0, "step": 3, "val_nll": 1.7, "kind": "val"}])
    new = store.metrics(run_id, since_id=last)
    assert [(r["rank"], r["step"], r["kind"]) for r in new] == [(1, 3, "train"), (0, 3, "val")]
    assert all(r["id"] > last for r in new)
    assert [r["val_nll"] for r in store.metrics(run_id, kind="val")] == [1.7]
    assert len(store.metrics(run_id, kind="train")) == 4

    store.add_metrics(run_id, [])  # an empty batch is fine and writes nothing
    assert len(store.metrics(run_id)) == 5
    with pytest.raises(ValueError, match="lsos"):
        store.add_metrics(run_id, [{"lsos": 1.0}])
    with pytest.raises(PetmodelError):
        store.add_metrics("missing", [{"loss": 1.0}])


def test_metrics_frame_columns(store: RunStore) -> None:
    empty = store.metrics_frame([])
    assert list(empty.columns) == list(METRIC_COLUMNS) and len(empty) == 0
    assert "run_id" in empty.columns

    a = store.create_run({})
    b = store.create_run({})
    store.add_metrics(a, [{"rank": 0, "step": 1, "loss": 1.0}])
    store.add_metrics(b, [{"rank": 0, "step": 1, "loss": 2.0}, {"rank": 0, "step": 2, "val_nll": 3.0, "kind": "val"}])
    frame = store.metrics_frame([a, b])
    assert list(frame.columns) == list(METRIC_COLUMNS)
    assert list(frame["run_id"]) == [a, b, b]
    assert frame["loss"].iloc[0] == 1.0 and frame["loss"].isna().tolist() == [False, False, True]
    assert frame["val_nll"].dtype == "float64" and frame["samples_per_s"].dtype == "float64"
    assert list(frame["step"]) == [1, 1, 2]
    assert len(store.metrics_frame([a])) == 1
    assert len(store.metrics_frame(["unknown"])) == 0


def test_concurrent_writer_processes_and_reader(store: RunStore) -> None:
    run_id = store.create_run({}, status="running")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_write_metrics, args=(str(store.root), run_id, rank, start)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    start.set()

    seen: list[dict] = []
    last_id = 0
    deadline = time.monotonic() + 60
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        new = store.metrics(run_id, since_id=last_id)  # the app's polling pattern
        if new:
            seen.extend(new)
            last_id = new[-1]["id"]
        assert store.get_run(run_id) is not None
        store.list_runs(limit=5)
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    seen.extend(store.metrics(run_id, since_id=last_id))

    total = 2 * BATCHES * ROWS_PER_BATCH
    assert len(seen) == total
    ids = [r["id"] for r in seen]
    assert ids == sorted(ids) and len(set(ids)) == total
    for rank in (0, 1):
        steps = [r["step"] for r in seen if r["rank"] == rank]
        assert steps == list(range(BATCHES * ROWS_PER_BATCH))
    assert len(store.metrics(run_id)) == total


def _open_fresh_store(root: str, barrier, errors) -> None:
    barrier.wait()
    try:
        store = RunStore(root)
        store.reconcile_orphans()  # what the CLI does first
        store.create_run({})
    except PetmodelError as err:
        errors.put(str(err))


def test_processes_creating_one_new_store_at_once(tmp_path: Path) -> None:
    """Two CLI launches on a fresh --store raced on the switch to WAL, which SQLite fails at once."""
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for attempt in range(12):  # the race lost about one process in ten before the fix
        root = tmp_path / f"store{attempt}"
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_open_fresh_store, args=(str(root), barrier, errors)) for _ in range(4)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(30)
            assert proc.exitcode == 0
        assert errors.empty(), errors.get()
        assert len(RunStore(root).list_runs()) == 4


def test_threads_share_one_store(store: RunStore) -> None:
    run_id = store.create_run({})
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            for step in range(50):
                store.add_metrics(run_id, [{"rank": rank, "step": step}])
                store.metrics(run_id, since_id=0)
        except BaseException as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(rank,)) for rank in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(store.metrics(run_id)) == 200


def test_reconcile_orphans(store: RunStore) -> None:
    host = socket.gethostname()
    dead = _dead_pid()
    orphan = store.create_run({}, status="running", owner=f"{host}:{dead}")
    queued_orphan = store.create_run({}, status="queued", owner=f"{host}:{dead}")
    alive = store.create_run({}, status="running", owner=current_owner())
    remote = store.create_run({}, status="running", owner=f"not-{host}:{dead}")
    done = store.create_run({}, status="completed", owner=f"{host}:{dead}")
    unowned = store.create_run({}, status="running")
    assert current_owner() == f"{host}:{os.getpid()}"

    before = time.time()
    reaped = store.reconcile_orphans()
    assert sorted(reaped) == sorted([orphan, queued_orphan])
    run = store.get_run(orphan)
    assert run is not None and run.status == "failed"
    assert run.error == f"The process driving this run stopped before it finished (pid {dead})."
    assert run.finished is not None and run.finished >= before
    for untouched, status in ((alive, "running"), (remote, "running"), (done, "completed"), (unowned, "running")):
        record = store.get_run(untouched)
        assert record is not None and record.status == status and record.error is None
    assert store.reconcile_orphans() == []


def test_resolve_model(store: RunStore, tmp_path: Path) -> None:
    run_id = store.create_run({}, status="completed")
    ckpt = store.checkpoint_path(run_id)
    assert ckpt == store.checkpoint_dir / f"{run_id}.pt" and not ckpt.exists()
    ckpt.write_bytes(b"weights")
    store.update_run(run_id, model_path=str(ckpt))
    assert store.resolve_model(run_id) == ckpt

    loose = tmp_path / "elsewhere.pt"
    loose.write_bytes(b"weights")
    assert store.resolve_model(str(loose)) == loose

    no_model = store.create_run({}, status="failed")
    with pytest.raises(PetmodelError, match="no saved model"):
        store.resolve_model(no_model)

    ckpt.unlink()
    with pytest.raises(PetmodelError, match="deleted"):
        store.resolve_model(run_id)

    with pytest.raises(PetmodelError) as info:
        store.resolve_model("ghost")
    assert str(info.value) == "No run or checkpoint file called 'ghost'; list runs with `python -m petmodel runs`."


def test_run_nll_prefers_the_best_validation(store: RunStore) -> None:
    a = store.create_run({}, status="completed")
    b = store.create_run({}, status="completed")
    store.update_run(a, best_val_nll=1.4, val_nll=1.6)
    store.update_run(b, val_nll=1.3)  # no best: falls back to the last validation
    assert store.get_run(a).nll == 1.4 and store.get_run(b).nll == 1.3  # type: ignore[union-attr]
    assert store.get_run(store.create_run({})).nll is None  # type: ignore[union-attr]


def test_reconcile_orphan_studies(store: RunStore) -> None:
    host = socket.gethostname()
    dead = _dead_pid()
    orphan = store.create_study({"owner": f"{host}:{dead}"}, kind="sweep")
    alive = store.create_study({"owner": current_owner()}, kind="search")
    remote = store.create_study({"owner": f"not-{host}:{dead}"}, kind="sweep")
    done = store.create_study({"owner": f"{host}:{dead}"}, kind="sweep", status="completed")
    assert store.reconcile_orphans() == [orphan]
    study = store.get_study(orphan)
    assert study is not None and study.status == "failed"
    assert study.error == f"The process driving this study stopped before it finished (pid {dead})."
    for untouched, status in ((alive, "running"), (remote, "running"), (done, "completed")):
        assert store.get_study(untouched).status == status  # type: ignore[union-attr]


def test_a_store_written_with_the_old_heartbeat_column_still_reads(tmp_path: Path) -> None:
    import sqlite3

    store = RunStore(tmp_path / "old")
    run_id = store.create_run({"x": 1}, status="completed")
    with sqlite3.connect(store.db_path) as conn:
        conn.execute("ALTER TABLE runs ADD COLUMN heartbeat REAL")
        conn.execute("UPDATE runs SET heartbeat = 1.0")
    again = RunStore(tmp_path / "old")
    assert again.get_run(run_id).config == {"x": 1}  # type: ignore[union-attr]
    assert [r.id for r in again.list_runs()] == [run_id]


def test_study_round_trip(store: RunStore) -> None:
    study_id = store.create_study({"grid": {"hidden": [64, 128]}}, kind="sweep", name="widths")
    study = store.get_study(study_id)
    assert study is not None
    assert (study.config, study.kind, study.name, study.status) == ({"grid": {"hidden": [64, 128]}}, "sweep", "widths", "running")
    store.update_study(study_id, status="completed", result={"best": "x"})
    study = store.get_study(study_id)
    assert study is not None and study.is_finished and study.result == {"best": "x"}
    other = store.create_study({}, kind="search")
    assert [s.id for s in store.list_studies()] == [other, study_id]
    assert [s.id for s in store.list_studies(limit=1)] == [other]
    with pytest.raises(ValueError):
        store.update_study(study_id, status="bogus")
    with pytest.raises(PetmodelError):
        store.update_study("missing", status="failed")
    assert store.get_study("missing") is None


def test_not_a_database_file(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    (root / "runs.sqlite").write_text("these are pet names, not a database\n" * 100)
    with pytest.raises(PetmodelError) as info:
        RunStore(root)
    assert str(root / "runs.sqlite") in str(info.value)


def test_root_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PetmodelError) as info:
        RunStore(blocker / "store")
    assert str(blocker / "store") in str(info.value)


def test_default_store_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PETMODEL_STORE", str(tmp_path / "custom"))
    assert default_store_dir() == tmp_path / "custom"
    monkeypatch.delenv("PETMODEL_STORE")
    path = default_store_dir()
    assert path.name == "store" and "petmodel" in str(path)


@pytest.fixture
def mounts(tmp_path: Path):
    """Real mounts (tmpfs, read-only bind) for disk-full and read-only stores; unmounted afterwards."""
    import subprocess

    made: list[Path] = []

    def mount(*args: str) -> None:
        proc = subprocess.run(["mount", *args], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount here (needs root): {proc.stderr.strip()}")
        made.append(Path(args[-1]))

    yield mount
    for target in reversed(made):
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def test_a_read_only_store_lists_and_resolves_but_refuses_writes(tmp_path: Path, mounts) -> None:
    src = RunStore(tmp_path / "src")
    run_id = src.create_run({"x": 1}, status="completed")
    ckpt = src.checkpoint_path(run_id)
    ckpt.write_bytes(b"weights")
    src.update_run(run_id, model_path=str(ckpt))
    ro = tmp_path / "ro"
    ro.mkdir()
    mounts("--bind", "-o", "ro", str(tmp_path / "src"), str(ro))
    mounts("-o", "remount,bind,ro", str(ro))
    store = RunStore(ro)
    assert store.readonly
    assert [r.id for r in store.list_runs()] == [run_id] and store.reconcile_orphans() == []
    assert store.resolve_model(run_id) == ro / "checkpoints" / f"{run_id}.pt"  # relative to where the store is
    with pytest.raises(PetmodelError, match="is read-only: it can be read but not changed") as info:
        store.create_run({})
    assert "\n" not in str(info.value)


def test_a_full_disk_is_one_sentence_and_leaves_nothing_half_written(tmp_path: Path, mounts) -> None:
    from petmodel.checkpoint import Checkpoint, save_checkpoint
    from petmodel.config import ModelConfig
    from petmodel.data import Alphabet
    from petmodel.model import CharLSTM

    disk = tmp_path / "disk"
    disk.mkdir()
    mounts("-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk))
    store = RunStore(disk / "store")
    run_id = store.create_run({}, status="running")
    config = ModelConfig(hidden=256)
    model = CharLSTM(config)  # ~1.4 MB of weights: more than the disk holds
    with pytest.raises(PetmodelError, match="^The disk is full: the model .* could not be saved") as info:
        save_checkpoint(store.checkpoint_path(run_id), Checkpoint(config, Alphabet(), model.state_dict(), {},
                                                                  frozenset()))
    assert "\n" not in str(info.value) and "inline_container" not in str(info.value)
    assert not list(store.checkpoint_dir.iterdir())  # no temporary or partial file left
    store.update_run(run_id, status="failed", error=str(info.value))  # the store can still say so
    filler = disk / "filler"
    with pytest.raises(OSError):
        filler.write_bytes(b"\0" * 1_000_000)
    with pytest.raises(PetmodelError, match="^The disk is full: the run store") as info:
        store.add_metrics(run_id, [{"step": s, "loss": float(s), "rank": 0} for s in range(20_000)])
    from petmodel.config import RunSpec
    from petmodel.runner import save_snapshot_quietly
    from petmodel.trainstate import save_state_bytes

    with pytest.raises(PetmodelError, match="^The disk is full: the training snapshot"):
        save_state_bytes(store.state_path(run_id), b"\0" * 500_000)
    assert save_snapshot_quietly(store, run_id, RunSpec(), b"\0" * 500_000) is False  # training would go on
    assert not list(store.checkpoint_dir.iterdir())
    filler.unlink()  # space freed: the store reads and writes again, with nothing half-written
    assert store.metrics(run_id) == []
    assert store.get_run(run_id).status == "failed"  # type: ignore[union-attr]


def test_a_moved_store_still_finds_its_models(tmp_path: Path) -> None:
    import shutil
    import sqlite3

    store = RunStore(tmp_path / "before")
    run_id = store.create_run({}, status="completed")
    old = store.create_run({}, status="completed")
    for rid in (run_id, old):
        store.checkpoint_path(rid).write_bytes(b"weights")
    store.update_run(run_id, model_path=str(store.checkpoint_path(run_id)))
    with sqlite3.connect(store.db_path) as conn:  # how stores written before kept it: absolute
        conn.execute("UPDATE runs SET model_path = ? WHERE id = ?", (str(store.checkpoint_path(old)), old))
        stored = conn.execute("SELECT model_path FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
    assert stored == f"checkpoints/{run_id}.pt"  # relative to the store
    shutil.move(str(tmp_path / "before"), str(tmp_path / "after"))
    moved = RunStore(tmp_path / "after")
    for rid in (run_id, old):
        assert moved.resolve_model(rid) == tmp_path / "after" / "checkpoints" / f"{rid}.pt"
        assert moved.get_run(rid).model_path == str(tmp_path / "after" / "checkpoints" / f"{rid}.pt")  # type: ignore[union-attr]
    outside = tmp_path / "mine.pt"
    outside.write_bytes(b"weights")
    moved.update_run(old, model_path=str(outside))
    assert moved.resolve_model(old) == outside  # a file outside the store keeps its own path


def test_sqlite_errors_are_told_apart_by_their_code_never_their_text(tmp_path) -> None:
    """Issue 42: the store decides on ``sqlite_errorcode`` (extended codes folded), so a message that merely
    reads "locked" is not taken for a lock, and a busy database is one whatever its wording."""
    from petmodel.errors import is_disk_full, sqlite_code

    store = RunStore(tmp_path)

    def error(code: int | None, text: str = "some text", kind: type = sqlite3.OperationalError) -> BaseException:
        err = kind(text)
        if code is not None:
            err.sqlite_errorcode = code
        return err

    def said(err: BaseException) -> str:
        out = store._sentence(err)
        return str(out) if isinstance(out, PetmodelError) else "raised as it is"

    assert "stayed locked by another process" in said(error(sqlite3.SQLITE_BUSY, "whatever it says"))
    assert "stayed locked" in said(error(sqlite3.SQLITE_LOCKED | (1 << 8)))  # SQLITE_LOCKED_SHAREDCACHE
    assert said(error(sqlite3.SQLITE_FULL)).startswith("The disk is full")
    assert "is read-only" in said(error(sqlite3.SQLITE_READONLY | (3 << 8)))  # SQLITE_READONLY_ROLLBACK
    assert "disk I/O error" in said(error(sqlite3.SQLITE_IOERR | (10 << 8)))
    assert "Cannot open" in said(error(sqlite3.SQLITE_CANTOPEN))
    assert "not a usable SQLite database" in said(error(sqlite3.SQLITE_NOTADB, kind=sqlite3.DatabaseError))
    assert said(error(None, "database is locked")) == "raised as it is"  # text alone decides nothing
    assert said(error(sqlite3.SQLITE_ERROR, "no such table: runs")) == "raised as it is"  # a bug keeps its traceback
    assert sqlite_code(ValueError("x")) is None and is_disk_full(error(sqlite3.SQLITE_FULL))
    assert not is_disk_full(error(None, "database or disk is full"))
