"""Cluster access and worker tuning against a real LocalCluster of worker processes (no mocks).

Tests that only read from a cluster, or connect to it and disconnect, share conftest's
``cluster`` (2 worker processes, 1 thread each): starting worker processes dominates the run
time on a small machine. A test that shuts a cluster down starts its own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import suppress

import psutil
import pytest
from distributed import Client

from petmodel.cluster.connect import connect, dashboard_link, shutdown
from petmodel.cluster.local import start_local_cluster
from petmodel.cluster.workers import choose_workers
from petmodel.cluster.tuning import (
    PLUGIN_NAME,
    TorchThreadsPlugin,
    undo_dask_malloc_trim,
)
from petmodel.cluster import reservations, shipping, versions
from petmodel.cluster.calls import on_scheduler
from petmodel.cluster.probes import probe_versions, registered_zip
from petmodel.cluster.security import TlsFiles
from petmodel.cluster.tuning import pinned_to_own_cpus
from petmodel.cluster.workers import WorkerInfo, cpu_slots, describe_workers
from petmodel.errors import PetmodelError, UsageError


def torch_version() -> str:
    import torch

    return torch.__version__


@pytest.fixture
def client(cluster: Client) -> Client:
    """conftest's shared 2-worker cluster, under the name these tests use."""
    return cluster


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Threads started since ``before`` and still alive, but distributed's process-wide offload pool."""
    time.sleep(0.3)  # let a stopping loop thread finish
    return [t for t in set(threading.enumerate()) - before
            if t.is_alive() and not t.name.startswith("Dask-Offload")]


def _one_sentence(message: str) -> bool:
    return message.endswith(".") and "\n" not in message and message.count(". ") == 0


def test_describe_workers(client: Client) -> None:
    workers = describe_workers(client)
    assert len(workers) == 2
    assert all(isinstance(w, WorkerInfo) for w in workers)
    assert len({w.address for w in workers}) == 2
    for w in workers:
        assert w.host
        assert w.nthreads == 1
        assert w.memory_limit > 0
        assert w.gpu_count == 0 and w.gpu_name is None and not w.has_gpu
        assert w.pid is not None and w.pid != os.getpid()
        assert w.to_dict()["address"] == w.address
    # Same order every time: it is the DDP rank order.
    assert [w.address for w in describe_workers(client)] == [w.address for w in workers]
    # Without the GPU probe: the same workers and scheduler facts, no GPUs.
    cheap = describe_workers(client, probe_gpus=False)
    assert [(w.address, w.host, w.nthreads, w.memory_limit, w.gpu_count) for w in cheap] == [
        (w.address, w.host, w.nthreads, w.memory_limit, 0) for w in workers
    ]
    # Both workers share this host: slots 0 and 1 of 2, in rank order (each pins its own core).
    assert cpu_slots(workers) == {workers[0].address: (0, 2), workers[1].address: (1, 2)}
    for bad in (0, -1, True, "5"):
        with pytest.raises(UsageError, match="timeout"):
            describe_workers(client, timeout=bad)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _set_torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _plugin_names(dask_worker) -> list[str]:
    return list(dask_worker.plugins)


def _dask_setting(key: str) -> object:
    import dask

    return dask.config.get(key)


def test_torch_threads_follow_worker_threads(client: Client) -> None:
    for names in client.run(_plugin_names).values():
        assert PLUGIN_NAME in names
    assert set(client.run(_torch_threads).values()) == {1}
    # The nanny's OMP_NUM_THREADS=1 would give 1 thread even without the plugin, so
    # prove the plugin does the setting: spoil the value, then register it again.
    try:
        client.run(_set_torch_threads, 2)
        assert set(client.run(_torch_threads).values()) == {2}
        client.register_plugin(TorchThreadsPlugin(), name=PLUGIN_NAME)
        assert set(client.run(_torch_threads).values()) == {1}
    finally:  # the cluster is shared: leave it as found even if an assertion failed
        client.run(_set_torch_threads, 1)


def _malloc_env() -> str | None:
    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


def test_local_workers_keep_glibc_malloc_adaptive(client: Client, monkeypatch) -> None:
    # Dask's nanny would set MALLOC_TRIM_THRESHOLD_=65536 (a fresh mmap per large tensor).
    assert set(client.run(_malloc_env).values()) == {None}
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert undo_dask_malloc_trim() is False  # nothing to undo
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # a worker started by someone else's nanny
    assert undo_dask_malloc_trim() is True


def test_cluster_summary(client: Client) -> None:
    # What the app's cluster page shows, read through the library's entry points.
    workers = describe_workers(client)
    summary = (len(workers), sum(w.nthreads for w in workers), sum(w.gpu_count for w in workers))
    assert summary == (2, 2, 0)
    assert {w.host for w in workers} == {client.scheduler.address.split("://")[1].rsplit(":", 1)[0]}
    link = dashboard_link(client)
    assert link is not None and link.startswith("http://127.0.0.1:") and link.endswith("/status")
    # the embedded cluster, dashboard included, listens on the loopback interface only
    assert client.scheduler.address.startswith("tcp://127.0.0.1:")
    port = int(link.split(":")[2].split("/")[0])
    assert {c.laddr.ip for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
            and c.status == psutil.CONN_LISTEN} == {"127.0.0.1"}


def test_connect_by_address(client: Client) -> None:
    address = client.scheduler.address
    threads_before = set(threading.enumerate())
    for form in (address, address.removeprefix("tcp://")):
        other = connect(form, timeout=10)
        try:
            assert other.scheduler.address == address
            assert len(describe_workers(other)) == 2
            # versions were compared on every process; the workers already import this code: nothing shipped
            assert [r["role"] for r in other.petmodel_versions] == ["client", "scheduler", "worker", "worker"]
            assert {r["torch"] for r in other.petmodel_versions} == {torch_version()}
            assert other.petmodel_code_hash == shipping.code_hash()
            assert on_scheduler(other, registered_zip, timeout=5, name=shipping.PLUGIN_NAME) is None
        finally:
            shutdown(other)
        assert other.status == "closed"
    # Disconnecting stops the client's own event-loop thread and leaves the cluster running.
    assert _new_threads(threads_before) == []
    assert len(describe_workers(client)) == 2


def _join_worker(scheduler: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", scheduler, "--nthreads", "1",
                             "--no-nanny", "--host", "127.0.0.1"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


@pytest.mark.slow  # a long end-to-end path: the full suite's, not the edit loop's
def test_workers_that_join_after_connect_have_their_versions_checked_at_launch(client: Client, corpus,
                                                                               tmp_path) -> None:
    from petmodel.config import RunSpec, TrainConfig
    from petmodel.cluster.launch import launch_run
    from petmodel.store import RunStore

    # A real worker process whose environment has another dask-pytorch-ddp installed (metadata first on its path).
    fake = tmp_path / "site"
    (fake / "dask_pytorch_ddp-0.0.1.dist-info").mkdir(parents=True)
    (fake / "dask_pytorch_ddp-0.0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dask-pytorch-ddp\nVersion: 0.0.1\n")
    other = connect(client.scheduler.address, timeout=10)
    before = {w.address for w in describe_workers(other)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])}
    joiner = _join_worker(client.scheduler.address, env)
    try:
        deadline = time.monotonic() + 30
        while len(before) == len(describe_workers(other, probe_gpus=False)) and time.monotonic() < deadline:
            time.sleep(0.2)
        [late] = {w.address for w in describe_workers(other, probe_gpus=False)} - before
        spec = RunSpec(train=TrainConfig(max_seconds=None, max_steps=2, batch_size=16), hidden=16, embed=8,
                       workers=1)
        store = RunStore(tmp_path / "store")
        with pytest.raises(PetmodelError) as refused:
            launch_run(other, spec, store, corpus=corpus, workers=[late])
        assert str(refused.value) == (f"The worker on {socket.gethostname()} ({late}) runs dask-pytorch-ddp 0.0.1 but "
                                      f"this client runs {probe_versions()['dask-pytorch-ddp']}; install the same "
                                      "version on both.")
        assert store.list_runs() == []  # refused before the run was recorded
        # The workers compared at connect are not asked again, and still train.
        assert launch_run(other, spec, store, corpus=corpus, workers=[sorted(before)[0]]).wait(60)["status"] == \
            "completed"
    finally:
        joiner.terminate()
        joiner.wait(30)
        shutdown(other)


def test_connect_by_scheduler_file(client: Client, tmp_path) -> None:
    path = tmp_path / "scheduler.json"
    # What `dask scheduler --scheduler-file` writes at start. (Client.write_scheduler_file dumps the
    # scheduler's live info, whose worker metrics have tuple keys once a task ran: json refuses them.)
    path.write_text(json.dumps({"type": "Scheduler", "id": "Scheduler-test", "address": client.scheduler.address,
                                "services": {}, "workers": {}}))
    other = connect(str(path), timeout=10)
    try:
        assert {w.address for w in describe_workers(other)} == {
            w.address for w in describe_workers(client)
        }
    finally:
        shutdown(other)


def test_connect_unreachable_fails_fast_and_cleans_up() -> None:
    threads_before = set(threading.enumerate())
    start = time.monotonic()
    with pytest.raises(PetmodelError) as info:
        connect("tcp://127.0.0.1:1", timeout=1)
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert "tcp://127.0.0.1:1" in message and "within 1 s" in message and _one_sentence(message)
    # A bare distributed.Client leaves its event-loop thread behind after a failed start.
    assert _new_threads(threads_before) == []


def _serve(server: socket.socket, reply: bytes, accepted: list[socket.socket]) -> None:
    with suppress(OSError):
        while True:
            conn, _ = server.accept()
            accepted.append(conn)
            if reply:
                conn.sendall(reply)


@pytest.mark.parametrize("reply", [b"", b"HTTP/1.1 400 Bad Request\r\n\r\n" * 4])
def test_connect_to_something_that_is_not_a_scheduler(reply: bytes) -> None:
    # Silent: accepts and never answers, which hangs a bare Client() past its timeout.
    # Chatty: answers garbage, which a bare Client() reports as a MemoryError.
    accepted: list[socket.socket] = []
    threads_before = set(threading.enumerate())
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        thread = threading.Thread(target=_serve, args=(server, reply, accepted), daemon=True)
        thread.start()
        try:
            start = time.monotonic()
            with pytest.raises(PetmodelError, match=f"127.0.0.1:{port}") as info:
                connect(f"127.0.0.1:{port}", timeout=1)
            assert time.monotonic() - start < 4
            assert _one_sentence(str(info.value))
        finally:
            with suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            thread.join(5)
            for conn in accepted:
                conn.close()
    assert _new_threads(threads_before) == []


@pytest.mark.parametrize(
    "address", ["not an address", "tcp://host:notaport", "host:notaport", "tcp://host:70000", ""]
)
def test_connect_malformed_address(address: str) -> None:
    with pytest.raises(UsageError) as info:
        connect(address)
    message = str(info.value)
    assert "tcp://host:port" in message and _one_sentence(message)


def test_connect_missing_or_bad_scheduler_file(tmp_path) -> None:
    with pytest.raises(PetmodelError, match="No scheduler file"):
        connect(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"no": "address"}))
    with pytest.raises(PetmodelError, match="not a Dask scheduler file"):
        connect(str(bad))


def test_choose_workers(client: Client) -> None:
    everyone = describe_workers(client)
    first, second = (w.address for w in everyone)
    assert [w.address for w in choose_workers(client, 1)] == [first]
    assert [w.address for w in choose_workers(client, 2)] == [first, second]  # rank order
    assert [w.address for w in choose_workers(client, 2, described=everyone)] == [first, second]
    # Explicit addresses keep the caller's order; an unknown one is named.
    assert [w.address for w in choose_workers(client, 2, addresses=[second, first])] == [second, first]
    with pytest.raises(PetmodelError) as info:
        choose_workers(client, 1, addresses=["tcp://127.0.0.1:1"])
    assert str(info.value) == "Worker tcp://127.0.0.1:1 is not in the cluster; pick from the current workers."
    with pytest.raises(PetmodelError) as info:
        choose_workers(client, 5)
    assert str(info.value) == (
        "Asked for 5 workers but the cluster has 2; start more workers or ask for fewer."
    )
    for bad in (0, -1, 1.5):
        with pytest.raises(UsageError, match="whole number"):
            choose_workers(client, bad)


@pytest.mark.parametrize("n_workers, threads", [(0, 1), (1, 0), (1.5, 1), (True, 1)])
def test_start_local_cluster_validates(n_workers, threads) -> None:
    with pytest.raises(UsageError):
        start_local_cluster(n_workers, threads)


def test_the_embedded_cluster_is_capped_by_the_machine_and_warns_before_sharing_cores(monkeypatch) -> None:
    from petmodel.cluster import local as cluster

    monkeypatch.setattr(cluster.os, "cpu_count", lambda: 2)
    monkeypatch.delenv(cluster.MAX_LOCAL_WORKERS_ENV, raising=False)
    assert cluster.oversubscription_note(2, 1) is None
    assert cluster.oversubscription_note(1, 2) is None
    note = cluster.oversubscription_note(3, 1)
    assert note and note.startswith("3 workers × 1 thread(s) share this machine's 2 cores") and "2 or fewer" in note
    assert cluster.oversubscription_note(2, 2).endswith("1 or fewer fit, or use a cluster.")
    with pytest.raises(UsageError, match=r"^16 local workers × 1 thread\(s\) is more than this 2-core machine can run "
                                         r"\(8 at most"):
        start_local_cluster(16, 1)  # refused before any process starts
    monkeypatch.setenv(cluster.MAX_LOCAL_WORKERS_ENV, "3")
    with pytest.raises(UsageError, match=r"\(3 at most"):
        start_local_cluster(4, 1)


def _tick_ms(dask_worker=None, dask_scheduler=None) -> float:
    return (dask_worker or dask_scheduler).periodic_callbacks["tick"].callback_time


def test_every_server_of_the_embedded_cluster_ticks_every_500_ms(cluster) -> None:
    """Dask's 20 ms event-loop tick is most of an idle cluster's CPU; the embedded cluster's servers use 500 ms."""
    assert set(cluster.run(_tick_ms).values()) == {500}  # the workers
    assert set(cluster.run(_tick_ms, nanny=True).values()) == {500}  # their nannies
    assert cluster.run_on_scheduler(_tick_ms) == 500


def test_shutdown_closes_the_owned_cluster() -> None:
    client = start_local_cluster(1, 1, dashboard_address=None, config={"distributed.admin.tick.interval": "123ms"})
    pids = [w.pid for w in describe_workers(client)]
    assert len(pids) == 1
    # config= goes on top of the library's worker tuning (a later dask.config.set would lose to it).
    assert set(client.run(_dask_setting, "distributed.admin.tick.interval").values()) == {"123ms"}
    assert set(client.run(_dask_setting, "distributed.worker.profile.interval").values()) == {"100ms"}
    cluster = client.cluster
    shutdown(client)
    assert client.status == "closed"
    assert cluster.status.name == "closed" and not cluster.workers
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(pid) for pid in pids)
    shutdown(client)  # a second call is harmless
    assert dashboard_link(client) is None
    with pytest.raises(PetmodelError, match="connect to the cluster again"):
        describe_workers(client)


def test_reservations_are_exclusive_across_clients_and_end_with_their_client(client: Client) -> None:
    address = client.scheduler.address
    workers = sorted(w.address for w in describe_workers(client, probe_gpus=False))
    other = Client(address, timeout=10)
    try:
        held = reservations.reserve(other, workers, 2)
        assert sorted(held.workers) == workers
        assert set(reservations.snapshot(client)["held"]) == set(workers)
        with pytest.raises(PetmodelError) as err:  # "don't wait": refused naming the busy workers
            reservations.reserve(client, workers, 1)
        assert str(err.value) == (f"Asked for 1 workers but only 0 of the cluster's 2 are free (busy with other "
                                  f"runs: {', '.join(workers)}); wait for a run to finish or ask for fewer.")
        # waiting: a visible place in the queue, and a cancel ends the wait and leaves the queue
        positions, cancel = [], threading.Event()
        threading.Timer(1.0, cancel.set).start()
        with pytest.raises(PetmodelError, match="cancelled while it waited"):
            reservations.reserve(client, workers, 1, wait=True, cancel=cancel,
                                 on_queue=lambda pos, busy: positions.append((pos, sorted(busy))))
        assert positions == [(1, workers)]
        assert reservations.snapshot(client)["queue"] == []
        # a queued launch gets the workers as soon as the holder's client goes away (its process died)
        threading.Timer(1.0, other.close).start()
        start = time.monotonic()
        mine = reservations.reserve(client, workers, 2, wait=True, max_wait_s=20)
        assert sorted(mine.workers) == workers and time.monotonic() - start < 10
        reservations.release(client, mine.key)
        assert reservations.snapshot(client)["held"] == {}
    finally:
        other.close()


def test_version_check_names_the_host_and_versions() -> None:
    mine = {"role": "client", "address": "", **probe_versions()}
    worker = {**mine, "role": "worker", "address": "tcp://10.0.0.7:4000", "host": "gpu7"}
    versions.check([mine, worker, {**worker, "torch": mine["torch"].split("+")[0] + "+cu128"}])  # same minor: fine
    with pytest.raises(PetmodelError) as err:
        versions.check([mine, {**worker, "distributed": "2024.1.0"}])
    assert str(err.value) == (f"The worker on gpu7 (tcp://10.0.0.7:4000) runs distributed 2024.1.0 but this client "
                              f"runs {mine['distributed']}; install the same version on both.")
    with pytest.raises(PetmodelError, match=r"^The worker on gpu7 \(tcp://10.0.0.7:4000\) has no dask-pytorch-ddp"):
        versions.check([mine, {**worker, "dask-pytorch-ddp": None}])
    scheduler = {**mine, "role": "scheduler", "address": "tcp://10.0.0.1:8786", "host": "sched", "torch": None}
    versions.check([mine, scheduler])  # a scheduler needs no torch
    with pytest.raises(PetmodelError, match=r"^The scheduler on sched \(tcp://10.0.0.1:8786\) runs python 3.10.4"):
        versions.check([mine, {**scheduler, "python": "3.10.4"}])


def test_tls_files_from_flags_then_environment(tmp_path) -> None:
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    env = {"PETMODEL_TLS_CA_FILE": str(tmp_path / "ca.pem"), "PETMODEL_TLS_KEY": str(tmp_path / "key.pem")}
    files = TlsFiles(cert=str(tmp_path / "cert.pem")).with_env(env)
    assert files == TlsFiles(str(tmp_path / "ca.pem"), str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    assert TlsFiles().with_env({}).security() is None  # nothing given: plain TCP
    with pytest.raises(PetmodelError, match="^TLS needs a CA file, a certificate and a key, but the key is missing"):
        TlsFiles(str(tmp_path / "ca.pem"), str(tmp_path / "cert.pem")).security()
    with pytest.raises(PetmodelError, match=r"^The TLS CA file .*nope.pem does not exist; check the path.$"):
        TlsFiles(str(tmp_path / "nope.pem"), str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")).security()
    with pytest.raises(PetmodelError, match="needs TLS: give a CA file, certificate and key"):
        connect("tls://127.0.0.1:1", timeout=1)


def test_a_worker_alone_on_its_host_is_not_pinned(monkeypatch) -> None:
    monkeypatch.delenv("PETMODEL_PIN_CPUS", raising=False)
    before = os.sched_getaffinity(0)
    with pinned_to_own_cpus(0, 1, 1):
        assert os.sched_getaffinity(0) == before
    if len(before) >= 2:  # two ranks on one host that fit its CPUs: each gets its own core
        with pinned_to_own_cpus(1, 2, 1):
            assert os.sched_getaffinity(0) == {sorted(before)[1]}
    assert os.sched_getaffinity(0) == before
