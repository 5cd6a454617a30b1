"""Cluster access against a real LocalCluster of worker processes (no mocks).

One two-worker cluster serves the whole module because starting worker processes (and
importing torch in them) dominates the run time on a small machine.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import suppress

import psutil
import pytest
from distributed import Client

from petmodel.dist.cluster import connect, dashboard_link, shutdown, start_local_cluster
from petmodel.dist.tuning import TorchThreadsPlugin
from petmodel.dist.workers import WorkerInfo, describe_workers
from petmodel.errors import PetmodelError, UsageError


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    client = start_local_cluster(2, 1)
    try:
        yield client
    finally:
        shutdown(client)


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


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _set_torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _plugin_names(dask_worker) -> list[str]:
    return list(dask_worker.plugins)


def test_torch_threads_follow_worker_threads(client: Client) -> None:
    for names in client.run(_plugin_names).values():
        assert "petmodel-torch-threads" in names
    assert set(client.run(_torch_threads).values()) == {1}
    # The nanny's OMP_NUM_THREADS=1 would give 1 thread even without the plugin, so
    # prove the plugin does the setting: spoil the value, then register it again.
    client.run(_set_torch_threads, 2)
    assert set(client.run(_torch_threads).values()) == {2}
    client.register_plugin(TorchThreadsPlugin(), name="petmodel-torch-threads")
    assert set(client.run(_torch_threads).values()) == {1}


def _malloc_env() -> str | None:
    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


def test_local_workers_keep_glibc_malloc_adaptive(client: Client, monkeypatch) -> None:
    # Dask's nanny would set MALLOC_TRIM_THRESHOLD_=65536 (a fresh mmap per large tensor, ~40% slower steps).
    assert set(client.run(_malloc_env).values()) == {None}
    from petmodel.dist.tuning import undo_dask_malloc_trim as _undo_dask_malloc_trim

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert _undo_dask_malloc_trim() is False  # nothing to undo
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # a worker started by someone else's nanny
    assert _undo_dask_malloc_trim() is True


def test_cluster_summary(client: Client) -> None:
    summary = cluster_summary(client)
    assert summary["scheduler"] == client.scheduler.address
    assert (summary["workers"], summary["threads"], summary["gpus"]) == (2, 2, 0)
    assert summary["dashboard"] is None or summary["dashboard"].startswith("http")


def test_connect_by_address(client: Client) -> None:
    address = client.scheduler.address
    for form in (address, address.removeprefix("tcp://")):
        other = connect(form, timeout=10)
        try:
            assert len(describe_workers(other)) == 2
        finally:
            shutdown(other)
    # Disconnecting a connected client leaves the cluster running.
    assert len(describe_workers(client)) == 2


def test_connect_by_scheduler_file(client: Client, tmp_path) -> None:
    path = tmp_path / "scheduler.json"
    client.write_scheduler_file(str(path))
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
        connect("tcp://127.0.0.1:1", timeout=3)
    assert time.monotonic() - start < 8
    message = str(info.value)
    assert "tcp://127.0.0.1:1" in message and _one_sentence(message)
    time.sleep(0.5)  # let a stopping loop thread finish
    leftover = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert leftover == []


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
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        thread = threading.Thread(target=_serve, args=(server, reply, accepted), daemon=True)
        thread.start()
        try:
            start = time.monotonic()
            with pytest.raises(PetmodelError, match=f"127.0.0.1:{port}") as info:
                connect(f"127.0.0.1:{port}", timeout=2)
            assert time.monotonic() - start < 6
            assert _one_sentence(str(info.value))
        finally:
            with suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            thread.join(5)
            for conn in accepted:
                conn.close()


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


def test_check_workers(client: Client) -> None:
    workers = check_workers(client, 1)
    assert [w.address for w in workers] == [describe_workers(client)[0].address]
    assert len(check_workers(client, 2)) == 2
    with pytest.raises(PetmodelError) as info:
        check_workers(client, 5)
    assert str(info.value) == (
        "Asked for 5 workers but the cluster has 2; start more workers or ask for fewer."
    )
    with pytest.raises(PetmodelError):
        check_workers(client, 0)


@pytest.mark.parametrize("n_workers, threads", [(0, 1), (1, 0), (1.5, 1), (True, 1)])
def test_start_local_cluster_validates(n_workers, threads) -> None:
    with pytest.raises(UsageError):
        start_local_cluster(n_workers, threads)


def test_shutdown_closes_the_owned_cluster() -> None:
    client = start_local_cluster(1, 1, dashboard_address=None)
    pids = [w.pid for w in describe_workers(client)]
    assert len(pids) == 1
    cluster = client.cluster
    shutdown(client)
    assert client.status == "closed"
    assert cluster.status.name == "closed" and not cluster.workers
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(pid) for pid in pids)
    shutdown(client)  # a second call is harmless
    with pytest.raises(PetmodelError):
        describe_workers(client)
