"""One test per Dask or torch internal petmodel relies on (see petmodel/compat.py): each fails the day
a release renames or changes it, instead of a run hanging or a shipped zip silently going missing.

An in-process cluster (worker threads, no processes) is enough to reach each internal, and starts in
a few milliseconds.
"""

from __future__ import annotations

import ast
import socket
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from distributed import Client, LocalCluster, SchedulerPlugin, WorkerPlugin
from distributed.diagnostics.plugin import UploadFile

from petmodel import compat
from petmodel.cluster import probes, reservation_state
from petmodel.cluster.probes import registered_zip

REPO = Path(__file__).resolve().parents[1]
THREADS = 2  # not the default of 1, so worker_nthreads cannot pass by accident


@pytest.fixture(scope="module")
def inproc() -> Iterator[tuple[LocalCluster, Client]]:
    with LocalCluster(n_workers=1, threads_per_worker=THREADS, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        yield cluster, client


class _Marker(WorkerPlugin):
    def setup(self, worker) -> None:
        worker._petmodel_compat_marker = True


class _SchedulerMarker(SchedulerPlugin):
    async def start(self, scheduler) -> None:
        scheduler._petmodel_compat_marker = True


def test_worker_plugins_register_under_a_bound(inproc) -> None:
    # Client._register_worker_plugin: a coroutine we can await under callback_timeout (shipping, thread tuning).
    _, client = inproc
    client.sync(compat.register_worker_plugin, client, _Marker(), name="petmodel-compat-test", callback_timeout=10)
    assert client.run(lambda dask_worker: getattr(dask_worker, "_petmodel_compat_marker", False)) == {
        a: True for a in client.scheduler_info()["workers"]}
    assert "petmodel-compat-test" in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins))


def test_scheduler_plugins_register_under_a_bound(inproc) -> None:
    # Client._register_scheduler_plugin: the scheduler half of shipping the code.
    _, client = inproc
    client.sync(compat.register_scheduler_plugin, client, _SchedulerMarker(), name="petmodel-compat-test",
                callback_timeout=10)
    assert client.run_on_scheduler(lambda dask_scheduler: (
        "petmodel-compat-test" in dask_scheduler.plugins, getattr(dask_scheduler, "_petmodel_compat_marker", False),
    )) == (True, True)


def test_the_registered_zip_is_readable_on_the_scheduler(inproc, tmp_path: Path) -> None:
    # Scheduler.worker_plugins (name → pickled plugin), read by probes.registered_zip, which travels by value.
    _, client = inproc
    archive = tmp_path / "petmodel-compat-probe.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("README", "nothing to import\n")
    assert client.run_on_scheduler(registered_zip, name="petmodel-compat-zip") is None
    client.sync(compat.register_worker_plugin, client, UploadFile(str(archive), load=False),
                name="petmodel-compat-zip", callback_timeout=10)
    assert client.run_on_scheduler(registered_zip, name="petmodel-compat-zip") == archive.name


def test_reservations_see_the_schedulers_clients_and_workers(inproc) -> None:
    # Scheduler.clients / Scheduler.workers, and state kept as an attribute of the Scheduler object.
    _, client = inproc
    [worker] = client.scheduler_info()["workers"]

    def reserve(owner: str, dask_scheduler=None):
        return reservation_state.sched_reserve("petmodel-compat-key", owner, [worker], 1, False,
                                               dask_scheduler=dask_scheduler)

    try:
        assert client.run_on_scheduler(reserve, owner=client.id)["granted"] == [worker]
        assert client.run_on_scheduler(reservation_state.sched_reservations)["held"] == {worker: "petmodel-compat-key"}
        # A holder whose client is not connected is dropped: the lease ends with its client.
        client.run_on_scheduler(reservation_state.sched_release, key="petmodel-compat-key")
        client.run_on_scheduler(reserve, owner="a-client-that-left")
        assert client.run_on_scheduler(reservation_state.sched_reservations)["held"] == {}
    finally:
        client.run_on_scheduler(reservation_state.sched_release, key="petmodel-compat-key")


def test_scheduler_identity_describes_the_workers(inproc) -> None:
    # client.scheduler.identity(n_workers=-1): what describe_workers reads, bounded by a timeout.
    cluster, client = inproc
    identity = compat.scheduler_identity(client, timeout=10)
    [meta] = identity["workers"].values()
    assert meta["nthreads"] == THREADS and meta["memory_limit"] > 0
    assert {"host", "name"} <= set(meta)
    assert compat.scheduler_address(client) == cluster.scheduler_address


def test_worker_nthreads_reads_the_workers_state(inproc) -> None:
    # worker.state.nthreads: today's home of the thread count (no fallback needed yet).
    cluster, client = inproc
    [worker] = cluster.workers.values()
    assert worker.state.nthreads == THREADS
    assert compat.worker_nthreads(worker) == THREADS
    assert set(client.run(lambda dask_worker: compat.worker_nthreads(dask_worker)).values()) == {THREADS}


def test_worker_nthreads_falls_back_and_never_raises() -> None:
    class Old:
        nthreads = 3

    assert compat.worker_nthreads(Old()) == 3
    assert compat.worker_nthreads(object()) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forkserver preload is used on Linux only")
def test_embedded_workers_fork_from_a_server_that_imported_torch(cluster) -> None:
    """conftest's embedded cluster: its workers are not this process's children (they forked from the
    forkserver, whose preload list is ours, torch included)."""
    import multiprocessing.forkserver as forkserver
    import os

    assert compat.preload_forkserver()
    assert forkserver._forkserver._preload_modules == list(compat.FORKSERVER_PRELOAD)
    facts = cluster.run(lambda: (os.getppid(), multiprocessing_method()))
    assert len(facts) == 2
    for ppid, method in facts.values():
        assert ppid != os.getpid() and method == "forkserver"


def multiprocessing_method() -> str:
    import multiprocessing

    return multiprocessing.get_start_method(allow_none=True) or ""


def test_process_group_timeout_patch_reaches_torch(monkeypatch) -> None:
    # torch.distributed.distributed_c10d.default_pg_timeout: dask-pytorch-ddp's dispatch_with_ddp calls
    # init_process_group with no timeout, so torch's module default is the only bound. Prove torch still
    # reads it: a rank 0 whose peer never joins must give up after the patched 1 s, not 30 minutes.
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):  # restored after the test
        monkeypatch.setattr(c10d, name, getattr(c10d, name), raising=False)
    compat.set_default_process_group_timeout(1.0)
    assert c10d.default_pg_timeout == timedelta(seconds=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outcome: list[BaseException | str] = []

    def rank0() -> None:
        try:  # the same call as dispatch_with_ddp's, with the same fallback to the default
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
            outcome.append("joined")
        except BaseException as err:  # noqa: BLE001 - reported below
            outcome.append(err)

    start = time.monotonic()
    waiter = threading.Thread(target=rank0, daemon=True)  # a daemon: if torch ignores the patch,
    waiter.start()  # the test fails here instead of hanging for 30 minutes
    waiter.join(30)
    assert outcome, "init_process_group ignored the patched default timeout"
    assert not dist.is_initialized()
    [err] = outcome
    assert isinstance(err, dist.DistStoreError) and "Timed out" in str(err), err
    assert 0.9 < time.monotonic() - start < 15


@pytest.mark.parametrize("module", [probes, reservation_state])
def test_code_that_travels_by_value_imports_only_the_standard_library(module) -> None:
    # The constraint that keeps those internals out of petmodel.compat: a scheduler without petmodel runs them.
    # Besides the standard library, only what every scheduler has: distributed's public plugin base class.
    tree = ast.parse(Path(module.__file__).read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert names - sys.stdlib_module_names - {"__future__", "cloudpickle", "distributed"} == set()
    assert {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("distributed")} <= {"distributed.diagnostics.plugin"}
    assert module.__name__ in compat.BY_VALUE_INTERNALS or any(
        key.startswith(module.__name__ + ".") for key in compat.BY_VALUE_INTERNALS)


def _watch_release(path: str) -> None:
    """On a worker: say whether this task is wanted, then wait (20 s at most) until it is not."""
    import distributed

    from petmodel.compat import task_released

    worker = distributed.get_worker()
    Path(path).write_text("released at once" if task_released(worker) else "wanted")
    started = time.monotonic()
    while time.monotonic() - started < 20:
        if task_released(worker):
            Path(path).write_text("released")
            return
        time.sleep(0.05)


def test_task_released_sees_the_task_its_client_let_go(cluster, tmp_path: Path) -> None:
    """A cancelled task keeps running (a worker cannot stop its thread) but its state says so: ranks read it to
    stop training when their driver is gone."""
    flag = tmp_path / "seen"
    future = cluster.submit(_watch_release, str(flag), pure=False)
    deadline = time.monotonic() + 30
    while (not flag.exists() or not flag.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flag.read_text() == "wanted"
    cluster.cancel(future)
    deadline = time.monotonic() + 10
    while flag.read_text() != "released" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flag.read_text() == "released"
    assert compat.task_released(object()) is False  # not a worker in a task: keep training, never raise


def test_every_private_use_lives_in_compat() -> None:
    # client._register_*, c10d.default_pg_*, .scheduler.identity/.address and .state.nthreads appear nowhere else.
    needles = ("._register_scheduler_plugin", "._register_worker_plugin", "default_pg_timeout",
               "default_pg_nccl_timeout", "scheduler.identity", "scheduler.address", ".state.nthreads",
               ".state.tasks")
    files = [*(REPO / "petmodel").rglob("*.py"), *(REPO / "pages").glob("*.py"), REPO / "streamlit_app.py"]
    offenders = {str(p.relative_to(REPO)): [n for n in needles if n in p.read_text()] for p in files
                 if p.name != "compat.py"}
    assert {p: found for p, found in offenders.items() if found} == {}
