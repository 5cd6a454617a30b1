"""One test per Dask, dask-gateway, torch or Streamlit internal petmodel relies on, and per library message
petmodel reads (see petmodel/compat.py): each fails the day a release renames or changes it, instead of a
run hanging, a shipped zip silently going missing or an error taking the wrong branch. Each builds the real
library object or error where it can. (``tests/test_compat_scan.py`` checks that no other module uses one.)

An in-process cluster (worker threads, no processes) is enough to reach each Dask internal, and starts in
a few milliseconds.
"""

from __future__ import annotations

import ast
import asyncio
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


# --------------------------------------------------------------------------- distributed: bounded calls
async def _slow(seconds: float, dask_scheduler=None) -> str:
    await asyncio.sleep(seconds)
    return "done"


def test_sync_within_returns_or_gives_up_after_its_timeout(inproc) -> None:
    # Client.sync(..., callback_timeout=…): shipping, run_each and thread tuning rely on the bound.
    _, client = inproc
    assert compat.sync_within(client, _slow, 0.01, timeout=10) == "done"
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        compat.sync_within(client, _slow, 5, timeout=0.3)
    assert time.monotonic() - start < 3


def test_run_on_scheduler_within_passes_keywords_and_gives_up(inproc) -> None:
    # Client.run_on_scheduler hands its keywords to Client.sync, so callback_timeout bounds it.
    _, client = inproc
    assert compat.run_on_scheduler_within(client, _slow, timeout=10, seconds=0.01) == "done"
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        compat.run_on_scheduler_within(client, _slow, timeout=0.3, seconds=3)
    assert time.monotonic() - start < 3


def test_queue_get_within_gives_up_on_an_empty_queue(inproc) -> None:
    # distributed.Queue.get hands its keywords to Client.sync: what the snapshot collector's bound relies on.
    from distributed import Queue

    _, client = inproc
    queue = Queue("petmodel-compat-queue", client=client)
    queue.put({"step": 1})
    assert compat.queue_get_within(queue, timeout=10, batch=True) == [{"step": 1}]
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        compat.queue_get_within(queue, timeout=0.3)  # no item, and Queue.get's own timeout is None
    assert time.monotonic() - start < 3


def test_a_client_start_is_bounded_as_a_whole() -> None:
    # Client.start hands its keywords to distributed.utils.sync: a server that accepts and never answers
    # would hang Client(timeout=30) for 30 s; with the start's bound it gives up after 1 s.
    from petmodel.cluster.client import PetmodelClient

    assert compat.bounded_start_kwargs({"timeout": 5}, 1) == {"callback_timeout": 1, "timeout": 5}
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        start = time.monotonic()
        with pytest.raises((OSError, asyncio.TimeoutError)):
            PetmodelClient(f"tcp://127.0.0.1:{server.getsockname()[1]}", start_limit=1, own_loop=True, timeout=30)
        assert time.monotonic() - start < 10


def test_worker_identity_names_the_workers_scheduler(cluster) -> None:
    # distributed.rpc and the worker's identity handler: how `runs kill-worker` finds a run's scheduler.
    worker = next(iter(cluster.scheduler_info()["workers"]))
    identity = asyncio.run(compat.worker_identity(worker, timeout=10))
    assert identity["scheduler"] == compat.scheduler_address(cluster)


# --------------------------------------------------------------------------- dask-gateway
def test_gateway_option_fields_have_the_kinds_the_server_names() -> None:
    # Options._fields and Field._field_types: built from the wire format a gateway server sends.
    from dask_gateway.options import Options

    wire = [{"field": "workers", "default": 2, "label": "Workers", "spec": {"type": "int", "min": 1, "max": 8}},
            {"field": "memory", "default": 2.0, "label": "GiB", "spec": {"type": "float", "min": 1, "max": 4}},
            {"field": "gpu", "default": False, "label": "GPU", "spec": {"type": "bool"}},
            {"field": "size", "default": "s", "label": "Size", "spec": {"type": "select", "options": ["s", "m"]}},
            {"field": "image", "default": "x", "label": "Image", "spec": {"type": "string"}}]
    fields = compat.gateway_option_fields(Options._from_spec(wire))
    assert [(kind, field.field) for kind, field in fields] == [
        ("integer", "workers"), ("float", "memory"), ("bool", "gpu"), ("select", "size"), ("string", "image")]
    assert (fields[0][1].min, fields[0][1].max, fields[3][1].options) == (1, 8, ("s", "m"))
    assert compat.gateway_option_fields({"workers": 2}) is None  # not an Options: the caller guesses kinds


def test_a_gateway_closes_once(monkeypatch) -> None:
    # dask_gateway.Gateway.close called twice (its __del__ does) raises on a stopped loop; patched, it does not.
    import gc

    import dask_gateway

    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(repr(u.exc_value)))
    bare = dask_gateway.Gateway("http://127.0.0.1:1", auth=dask_gateway.BasicAuth("u", "p"))
    bare.close()
    with pytest.raises(RuntimeError):  # the day this passes, the patch can go
        bare.close()
    bare.__dict__.pop("_loop_runner", None)  # its __del__ would close a third time
    del bare
    patched = dask_gateway.Gateway("http://127.0.0.1:1", auth=dask_gateway.BasicAuth("u", "p"))
    compat.close_gateway_once(patched)
    patched.close()
    patched.close()
    del patched
    gc.collect()
    assert unraisable == []


def test_a_gateway_answer_that_is_not_json_is_a_json_decode_error() -> None:
    # dask-gateway reads answers with aiohttp's resp.json(), whose default decoder is json.loads: gateway_error
    # tells "something else answered" by isinstance(err, json.JSONDecodeError), not by the type's name.
    import json

    from aiohttp.typedefs import DEFAULT_JSON_DECODER

    from petmodel.cluster.gateway import gateway_error

    assert DEFAULT_JSON_DECODER is json.loads
    with pytest.raises(json.JSONDecodeError) as info:
        DEFAULT_JSON_DECODER("<html>a proxy's page</html>")
    assert "not as a Dask Gateway" in str(gateway_error(info.value, "http://127.0.0.1:1", "listing your clusters"))


def test_gateway_templates_read_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("PETMODEL_COMPAT_HOST", "gw.example.org")
    assert compat.format_gateway_template("https://{PETMODEL_COMPAT_HOST}/") == "https://gw.example.org/"
    assert compat.format_gateway_template(None) is None


# --------------------------------------------------------------------------- Streamlit
def test_streamlit_page_list_is_scriptable_and_navigation_ends_the_folder_mode() -> None:
    """The option the page-list workaround turns on may be set at run time, and ``st.navigation`` still ends
    the pages-folder mode (the flag the script runner reads). tests/test_app.py routes a first visit for real."""
    import inspect

    import streamlit as st
    from streamlit.commands import navigation
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.runtime.scriptrunner import script_runner

    before = st.get_option(compat.PAGE_LIST_OPTION)
    try:
        st.set_option(compat.PAGE_LIST_OPTION, False)
        compat.show_streamlit_page_list(st)
        assert st.get_option(compat.PAGE_LIST_OPTION) is True
    finally:
        st.set_option(compat.PAGE_LIST_OPTION, before)
    assert hasattr(PagesManager, "uses_pages_directory")
    assert "PagesManager.uses_pages_directory = False" in inspect.getsource(navigation)
    assert compat.PAGE_LIST_OPTION in inspect.getsource(script_runner._mpa_v1)


# Every BackMsg a browser can send (Streamlit 1.67), and whether it acts on the whole server: a new one in a later
# Streamlit fails the test below until it is read and classified (docs/SECURITY.md lists what each does).
KNOWN_BACKMSGS = {"clear_cache": "clear_cache", "load_git_info": "load_git_info", "rerun_script": None,
                  "stop_script": None, "app_heartbeat": None, "set_run_on_save": None, "file_urls_request": None,
                  "backend_operation_request": None, "debug_disconnect_websocket": None,
                  "debug_shutdown_runtime": None}
KNOWN_OPERATIONS = {"install_skills": "install_skills", "dismiss_skills_nudge": "dismiss_skills_nudge",
                    "deferred_file": None, "dataframe_chunk": None}


def test_every_backmsg_is_classified_as_its_own_session_or_the_whole_server() -> None:
    from streamlit.proto.BackMsg_pb2 import BackMsg, BackendOperationRequest

    assert {f.name for f in BackMsg.DESCRIPTOR.oneofs_by_name["type"].fields} == set(KNOWN_BACKMSGS)
    assert {f.name for f in BackendOperationRequest.DESCRIPTOR.oneofs_by_name["payload"].fields} == \
        set(KNOWN_OPERATIONS)
    for kind, wanted in KNOWN_BACKMSGS.items():
        msg = BackMsg()
        field = BackMsg.DESCRIPTOR.fields_by_name[kind]
        if field.message_type is None:
            setattr(msg, kind, True)
        else:
            getattr(msg, kind).SetInParent()
        assert compat.server_wide_message(msg) == wanted, kind
    for operation, wanted in KNOWN_OPERATIONS.items():
        msg = BackMsg()
        getattr(msg.backend_operation_request, operation).SetInParent()
        assert compat.server_wide_message(msg) == wanted, operation


def test_the_guard_wraps_the_one_place_a_sessions_messages_arrive() -> None:
    """What the guard relies on in Streamlit: the WebSocket handler hands every message to
    ``Runtime.handle_backmsg(session_id, msg, client=client)``, the client keeps the handshake's peer and headers,
    and a session's ``clear_cache`` clears every cache (what the guard keeps visitors from)."""
    import inspect

    from streamlit.runtime.app_session import AppSession
    from streamlit.runtime.runtime import Runtime
    from streamlit.web.server.starlette import starlette_websocket

    assert "runtime.handle_backmsg(session_id, back_msg, client=client)" in inspect.getsource(starlette_websocket)
    assert list(inspect.signature(Runtime.handle_backmsg).parameters) == ["self", "session_id", "msg", "client"]
    context = inspect.getsource(starlette_websocket.StarletteClientContext)
    assert "def remote_ip" in context and "def headers" in context
    clear = inspect.getsource(AppSession._handle_clear_cache_request)
    assert "cache_resource.clear()" in clear and "cache_data.clear()" in clear


def test_the_guard_drops_what_the_owner_check_refuses_and_passes_the_rest() -> None:
    """The wrapper on a stand-in Runtime (the real one needs a running server: tests/test_server_state.py)."""
    import types

    from streamlit.proto.BackMsg_pb2 import BackMsg

    handled: list[str] = []

    class Runtime:
        def handle_backmsg(self, session_id, msg, *, client=None):
            handled.append(msg.WhichOneof("type"))

        def get_client(self, session_id):
            return clients[session_id]

    def client(peer: str | None, host: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(client_context=types.SimpleNamespace(remote_ip=peer, headers=[("Host", host)]))

    clients = {"owner": client("127.0.0.1", "localhost:8501"), "rebound": client("127.0.0.1", "evil.test:8501"),
               "remote": client("198.51.100.7", "app.example")}
    seen: list[tuple] = []

    def allow(peer, headers):
        seen.append((peer, headers))
        return headers.get("host", "").startswith("localhost")

    st = types.SimpleNamespace(runtime=types.SimpleNamespace(Runtime=Runtime))
    compat.guard_server_wide_messages(st, allow)
    compat.guard_server_wide_messages(st, allow)  # idempotent: one wrapper
    runtime = Runtime()
    for session in clients:
        runtime.handle_backmsg(session, BackMsg(clear_cache=True), client=clients[session])
        runtime.handle_backmsg(session, BackMsg(load_git_info=True))  # no client given: asks the runtime
        runtime.handle_backmsg(session, BackMsg(app_heartbeat=True), client=clients[session])
    assert handled == ["clear_cache", "load_git_info", "app_heartbeat", "app_heartbeat", "app_heartbeat"]
    assert ("127.0.0.1", {"host": "evil.test:8501"}) in seen and len(seen) == 6  # heartbeats are never asked about


# --------------------------------------------------------------------------- what only a message tells
class _Callable:
    """A pickle that asks to import a callable (os.getcwd: harmless, were it ever run)."""

    def __reduce__(self):
        import os

        return os.getcwd, ()


def _load_error(data: bytes) -> BaseException:
    import io

    import torch

    try:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - the error is the result
        return err
    raise AssertionError("torch.load read it")


def test_an_untrusted_pickle_is_told_from_a_damaged_one() -> None:
    # torch.load(weights_only=True) raises UnpicklingError for both; only its message tells them apart.
    import io
    import pickle

    import torch

    buf = io.BytesIO()
    torch.save({"x": _Callable()}, buf)
    untrusted = _load_error(buf.getvalue())
    damaged = _load_error(b"\x80\x02garbage")
    assert isinstance(untrusted, pickle.UnpicklingError) and isinstance(damaged, pickle.UnpicklingError)
    assert compat.is_untrusted_pickle(untrusted)
    assert not compat.is_untrusted_pickle(damaged)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device that is always full")
def test_a_full_disk_is_read_from_torchs_write_error() -> None:
    # torch.save's zip writer reports a failed write as a RuntimeError with no errno.
    import torch

    from petmodel.errors import is_disk_full

    with pytest.raises(RuntimeError) as info:
        torch.save({"x": torch.zeros(100_000)}, "/dev/full")
    assert compat.says_disk_full(info.value) and is_disk_full(info.value)
    assert not compat.says_disk_full(RuntimeError("shape mismatch"))


def test_out_of_memory_is_read_from_torchs_errors() -> None:
    # The CPU allocator's RuntimeError (a real one: 1 PiB is past any address space), CUDA's type by name.
    import torch

    from petmodel.cluster.failures import error_summary

    with pytest.raises(RuntimeError) as info:
        torch.empty(2**50, dtype=torch.uint8)
    assert compat.is_out_of_memory(type(info.value).__name__, error_summary(info.value))
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert compat.is_out_of_memory(type(cuda).__name__, error_summary(cuda))
    assert compat.is_out_of_memory(MemoryError.__name__, "")
    assert not compat.is_out_of_memory("RuntimeError", "RuntimeError: shape mismatch")


def test_dask_logs_its_errors_in_one_line_without_tracebacks() -> None:
    """In a process of its own (as the CLI; pytest's root handlers make distributed skip its own): distributed
    puts its stderr handler on the ``distributed`` logger, and ours turns a logged exception into one line and
    drops a closing client's cancelled reconnect. Fails the day distributed logs elsewhere."""
    import subprocess

    code = """if True:
        import asyncio, logging
        from petmodel.compat import dask_errors_in_one_line
        dask_errors_in_one_line(); dask_errors_in_one_line()
        log = logging.getLogger("distributed.utils")
        for exc in (OSError("Connection refused\\nand more"), asyncio.CancelledError()):
            try:
                raise exc
            except BaseException:
                log.exception("reconnecting to %s", "tcp://h:1")
        print(len(logging.getLogger("distributed").handlers[0].filters))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"  # one filter, however often installed
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].endswith("reconnecting to tcp://h:1 (OSError: Connection refused)"), lines
