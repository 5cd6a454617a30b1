"""Every use of a private or version-dependent Dask, torch or Streamlit API, and every decision taken on
another library's message text, each with the reason for it.

A new release of distributed, dask-gateway, torch or Streamlit may rename or remove any of these without
notice, so they live here and nowhere else, and ``tests/test_compat.py`` has a test for each that fails the
day it changes (rather than a run hanging for 30 minutes, or a shipped zip silently not reaching new
workers). ``tests/test_compat_scan.py`` parses every other module of ``petmodel/``, ``pages/`` and
``streamlit_app.py`` and fails on a new one (a private attribute or module, ``callback_timeout``, a
monkey-patch, a test of an exception's text or of a type's name), so none can slip in elsewhere. Each function says why the public API does not do, and what
breaks without it. What it wraps:

- distributed: bounded calls (:func:`sync_within`, :func:`run_on_scheduler_within`, :func:`queue_get_within`,
  :func:`bounded_start_kwargs`), plugin registration, the scheduler's and a worker's ``identity``
  (:func:`scheduler_identity`, :func:`scheduler_address`, :func:`worker_identity`), the forkserver preload,
  a worker's thread count and its task's state;
- dask-gateway: option fields (:func:`gateway_option_fields`), closing once (:func:`close_gateway_once`),
  its config templates (:func:`format_gateway_template`);
- torch: the default process-group timeout; what only a message tells (:func:`is_untrusted_pickle`,
  :func:`says_disk_full`, :func:`is_out_of_memory`);
- Streamlit: the page-list workaround (:func:`show_streamlit_page_list`, :func:`leave_streamlit_pages_folder`),
  which take the ``st`` module from the pages: the library itself never imports Streamlit; and the guard that
  drops server-wide messages from sessions that are not the owner's (:func:`guard_server_wide_messages`).

Two internals cannot live here: code that runs on a scheduler that may not have ``petmodel``
travels *by value* (cloudpickle) and must import only the standard library, so it cannot import
this module. They are listed in :data:`BY_VALUE_INTERNALS` and tested like the others.

Importing this module imports none of those libraries; each function imports what it touches.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Client, Queue, Worker
    from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

__all__ = [
    "BY_VALUE_INTERNALS",
    "bounded_start_kwargs",
    "client_running",
    "close_gateway_once",
    "dask_errors_in_one_line",
    "format_gateway_template",
    "future_errored",
    "gateway_option_fields",
    "guard_server_wide_messages",
    "is_out_of_memory",
    "is_untrusted_pickle",
    "leave_streamlit_pages_folder",
    "queue_get_within",
    "register_scheduler_plugin",
    "register_worker_plugin",
    "run_on_scheduler_within",
    "says_disk_full",
    "scheduler_address",
    "scheduler_identity",
    "set_default_process_group_timeout",
    "set_event_within",
    "show_streamlit_page_list",
    "server_wide_message",
    "sync_within",
    "task_released",
    "worker_identity",
    "worker_nthreads",
]

BY_VALUE_INTERNALS: dict[str, str] = {
    "petmodel.cluster.probes.registered_zip": (
        "reads Scheduler.worker_plugins (name → pickled plugin) to learn which zip the scheduler hands to "
        "workers that join later; no public API lists registered plugins"),
    "petmodel.cluster.reservation_state._reservations": (
        "reads Scheduler.clients and Scheduler.workers (keyed by client id and worker address) to drop the "
        "reservations of clients and workers that are gone, and keeps its state as an attribute it sets on the "
        "Scheduler object; the scheduler has no public store for a plugin-less extension's state"),
}
"""Internals used by functions that travel by value to the scheduler (standard library only): where, and why."""


# --------------------------------------------------------------------------- distributed: plugins
def register_scheduler_plugin(client: Client, plugin: SchedulerPlugin, *, name: str,
                              idempotent: bool = False) -> Awaitable[Any]:
    """The coroutine that registers ``plugin`` on the scheduler (``Client._register_scheduler_plugin``).

    Why private: ``Client.register_plugin`` (public) cannot be bounded by a timeout, so one frozen
    worker hangs it forever; awaiting this coroutine under :func:`sync_within` (or inside a coroutine
    that is) can be. Await it on the client's event loop.
    """
    return client._register_scheduler_plugin(plugin, name=name, idempotent=idempotent)


def register_worker_plugin(client: Client, plugin: WorkerPlugin, *, name: str,
                           idempotent: bool = False) -> Awaitable[Any]:
    """The coroutine that registers ``plugin`` on every worker, now and later (``Client._register_worker_plugin``).

    Why private: as :func:`register_scheduler_plugin`; the public ``register_plugin`` waits for every
    worker without a bound, and the scheduler's broadcast waits forever on a frozen one.
    """
    return client._register_worker_plugin(plugin, name=name, idempotent=idempotent)


# --------------------------------------------------------------------------- distributed: bounded calls
def sync_within(client: Client, fn: Callable[..., Awaitable[Any]], *args: Any, timeout: float, **kwargs: Any) -> Any:
    """``await fn(*args, **kwargs)`` on ``client``'s event loop, from a thread outside it; at most ``timeout`` s.

    Why internal: ``Client.sync`` is undocumented, and its ``callback_timeout`` keyword (handed on to
    ``distributed.utils.sync``, checked on distributed 2026.8.0) is the only way to bound a call to the
    cluster from a blocking caller: the awaited coroutine is cancelled and ``TimeoutError`` (an
    ``OSError``) raised when it runs out. Without it one frozen worker or scheduler hangs the caller forever.
    """
    return client.sync(fn, *args, callback_timeout=timeout, **kwargs)


def set_event_within(client: Client, name: str, value: bool, *, timeout: float) -> None:
    """Set (``value`` True) or clear the ``distributed.Event`` called ``name``, bounded by ``timeout``.

    Why internal: ``Event.set``/``Event.clear`` take no timeout, so a frozen scheduler hangs the caller for as
    long as it stays frozen; their body is one call of the scheduler's ``event_set``/``event_clear`` handler
    (checked on distributed 2026.8.0), which :func:`sync_within` bounds.
    """
    handler = client.scheduler.event_set if value else client.scheduler.event_clear
    sync_within(client, handler, name=name, timeout=timeout)


def run_on_scheduler_within(client: Client, fn: Callable[..., Any], *, timeout: float, **kwargs: Any) -> Any:
    """``Client.run_on_scheduler(fn, **kwargs)`` bounded by ``timeout``; ``TimeoutError`` when it runs out.

    Why internal: the public method takes no timeout; it hands its keywords to ``Client.sync``, which
    takes ``callback_timeout`` (see :func:`sync_within`), so ``fn`` cannot take a keyword of that name.
    """
    return client.run_on_scheduler(fn, callback_timeout=timeout, **kwargs)


def queue_get_within(queue: Queue, *, timeout: float, batch: bool = False) -> Any:
    """``distributed.Queue.get`` bounded by ``timeout`` (``TimeoutError`` when the scheduler does not answer).

    Why internal: ``Queue.get(timeout=…)`` bounds only the wait for an item, and the scheduler's reply is
    unbounded; its keywords go on to ``Client.sync``, whose ``callback_timeout`` bounds the whole call.
    """
    return queue.get(batch=batch, callback_timeout=timeout)


def bounded_start_kwargs(kwargs: Mapping[str, Any], limit: float) -> dict[str, Any]:
    """``Client.start``'s keywords with its whole start bounded by ``limit`` s (unless already bounded).

    Why internal: ``Client(timeout=…)`` bounds only the connection attempts, and a server that accepts the
    TCP connection but never answers hangs the start regardless; ``Client.start`` (in a subclass that
    overrides it) hands its keywords to ``distributed.utils.sync``, whose ``callback_timeout`` cancels the
    start when it runs out.
    """
    return {"callback_timeout": limit, **kwargs}


# --------------------------------------------------------------------------- distributed: the scheduler
def scheduler_identity(client: Client, *, timeout: float) -> dict[str, Any]:
    """The scheduler's description of itself and of every worker (its ``identity`` handler), within ``timeout``.

    Why private: ``client.scheduler`` is the client's RPC handle on the scheduler, and
    ``identity(n_workers=-1)`` the handler behind ``Client.scheduler_info()``. That public method
    cannot be bounded by a timeout and silently returns a stale cache when the scheduler is
    unreachable. Raises ``OSError`` (``TimeoutError`` included) when the scheduler does not answer.
    """
    return client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout)


def scheduler_address(client: Client) -> str:
    """The address of the scheduler this client talks to (``client.scheduler.address``).

    Why private: the only public spellings are ``Client.scheduler_info()["address"]`` (a cache that
    may be empty or stale, or a blocking round trip) and ``client.cluster.scheduler_address`` (only
    when the client started the cluster); the RPC handle's address is always current.
    """
    return str(client.scheduler.address)


async def worker_identity(address: str, *, timeout: float) -> dict[str, Any]:
    """The worker at ``address`` describes itself (its ``identity`` handler: ``"scheduler"``, ``"nthreads"``, …).

    Why internal: ``distributed.rpc`` (a connection to a server's handlers) and the worker's ``identity``
    handler are undocumented, and no public API asks a worker anything without a client of its cluster:
    ``runs kill-worker`` uses it to find the scheduler of a run whose address nobody wrote down. Await it
    on any event loop; ``TimeoutError`` or ``OSError`` when the worker does not answer.
    """
    import asyncio

    from distributed import rpc

    async with rpc(address, timeout=timeout) as r:
        return await asyncio.wait_for(r.identity(), timeout)


# --------------------------------------------------------------------------- distributed: worker processes
FORKSERVER_PRELOAD = ("distributed", "torch")


def preload_forkserver(modules: tuple[str, ...] = FORKSERVER_PRELOAD) -> bool:
    """Let nannies fork worker processes from a server that imported ``modules`` once; False where it cannot.

    Why: a spawned worker imports distributed and torch anew, about 2 s of CPU each, so every cluster
    start paid seconds per worker. Dask supports ``distributed.worker.multiprocessing-method:
    forkserver`` but preloads only its own dependencies, and ``distributed.utils.get_mp_context``
    sets that list the first time it is called (a private flag keeps it from doing so again). So
    call it first, then replace the list through multiprocessing's public ``set_forkserver_preload``
    before the server starts. Linux only (forking a process that imported torch is not safe on
    macOS). A forked worker gets the environment the server started with plus what its nanny sets
    (``distributed.nanny.environ`` and ``pre-spawn-environ``), not later changes to this process's.
    """
    import multiprocessing
    import sys

    import dask
    from distributed import utils

    if not sys.platform.startswith("linux") or "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        context = utils.get_mp_context()
    context.set_forkserver_preload(list(modules))
    return True


# --------------------------------------------------------------------------- distributed: a worker
def worker_nthreads(worker: Worker) -> int:
    """The threads ``worker`` runs tasks on (0 when it cannot say).

    Why internal: today's distributed keeps the count on the worker's state machine
    (``worker.state.nthreads``), which is not documented; older releases had ``worker.nthreads``.
    Training sets torch's thread count from it, so several ranks on one machine do not fight over cores.
    """
    state = getattr(worker, "state", None)
    nthreads = getattr(state, "nthreads", None) or getattr(worker, "nthreads", None)
    return int(nthreads or 0)


def dask_errors_in_one_line() -> None:
    """Make distributed's own log lines on stderr one line each in this process: no tracebacks.

    Why version-dependent: distributed installs its ``StreamHandler`` on the ``distributed`` logger when it is
    imported (``distributed.config.initialize_logging``, checked on 2026.8.0), and logs routine events of a
    lost scheduler with full tracebacks (``log_errors`` around the client's reconnect: a CancelledError when
    the client closes mid-reconnect). A CLI whose run ended in one sentence of ours would print them above
    it. The filter keeps each message, with its exception's type and first line, and drops the cancellations
    a closing client logs. Idempotent.
    """
    import logging

    import distributed  # noqa: F401 - importing it installs the handlers this filters

    for name in ("distributed", "tornado"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _OneLineErrors) for f in handler.filters):
                handler.addFilter(_OneLineErrors())


class _OneLineErrors:
    """A ``logging`` filter: a record's exception becomes ``(Type: first line)`` after its message."""

    def filter(self, record: Any) -> bool:
        import asyncio

        if not record.exc_info:
            return True
        exc = record.exc_info[1]
        if isinstance(exc, asyncio.CancelledError):  # a closing client's reconnect, cancelled: nothing to say
            return False
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        record.msg = f"{record.getMessage()} ({type(exc).__name__}{': ' + text if text else ''})"
        record.args, record.exc_info, record.exc_text = (), None, None
        return True


def client_running(client: Any) -> bool:
    """Whether a Dask client is connected and usable (``Client.status == "running"``).

    Why here: ``Client.status`` is a plain string of distributed's own words ("newly-created", "connecting",
    "running", "closing", "closed"; checked on distributed 2026.8.0), not an enum we can import; every test of
    it goes through this one function, so a new word breaks one place. ``None`` (no status at all) is not running.
    """
    return getattr(client, "status", None) == "running"


def future_errored(future: Any) -> bool:
    """Whether a Dask future's task raised (``Future.status == "error"``: distributed's word, as above)."""
    return getattr(future, "status", None) == "error"


def task_released(worker: Worker) -> bool:
    """Whether the task this thread runs is no longer wanted: its client released or cancelled it.

    Why internal: a worker cannot stop a running task's thread; when the scheduler lets go of the task (its
    client disconnected: a killed CLI, or a frozen scheduler that resumed after the client gave up) the worker
    only marks it ``"cancelled"`` on its state machine (``worker.state.tasks[key].state``, undocumented) and
    waits for it to return. No public API says so, and without it a rank trains on for the rest of its budget
    for nobody, taking the workers' cores. ``Worker.get_current_task`` is public. False when it cannot tell.
    """
    try:
        key = worker.get_current_task()
        task = worker.state.tasks.get(key)
    except Exception:  # noqa: BLE001 - not in a task, or another distributed: keep training
        return False
    return task is None or task.state in ("cancelled", "released", "forgotten")


# --------------------------------------------------------------------------- torch.distributed
def set_default_process_group_timeout(seconds: float) -> None:
    """Lower the default timeout ``init_process_group`` reads, in this process.

    Why internal: ``dask_pytorch_ddp.dispatch.dispatch_with_ddp`` calls ``init_process_group`` with no
    timeout and takes no option for one, so a rank whose peer never joins (or died silently) would
    wait torch's default of 30 minutes. ``init_process_group`` then falls back to the module defaults
    ``torch.distributed.distributed_c10d.default_pg_timeout`` (and ``default_pg_nccl_timeout`` for
    NCCL, in releases that have it), for the rendezvous and every collective, so we set those.
    """
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timedelta(seconds=seconds)
    if hasattr(c10d, "default_pg_nccl_timeout"):
        c10d.default_pg_nccl_timeout = timedelta(seconds=seconds)


# --------------------------------------------------------------------------- dask-gateway
_GATEWAY_KINDS = {"int": "integer"}  # the server's type names that petmodel spells otherwise


def gateway_option_fields(options: Any) -> list[tuple[str, Any]] | None:
    """Each field of a dask-gateway ``Options``, with its kind as the gateway names it (``"float"``, ``"bool"``,
    ``"select"``, ``"string"``, ``"mapping"``; its ``"int"`` as ``"integer"``); None when it cannot tell.

    Why private: ``Options`` (dask-gateway's only public options class) is a mapping of values; each field's
    type and bounds live in ``Options._fields`` (name → field), and the kind names the server sends, in
    ``Field._field_types`` (kind → class; checked on dask-gateway 2026.3.0). Without them a form can only
    guess the kinds from the values, and shows no bounds or choices.
    """
    try:
        from dask_gateway.options import Field

        fields = getattr(options, "_fields", None)
        registry = dict(getattr(Field, "_field_types", {}))  # kind → class
        kinds = {cls: _GATEWAY_KINDS.get(kind, kind) for kind, cls in registry.items()}
    except (ImportError, TypeError):
        return None
    if not isinstance(fields, Mapping):
        return None
    return [(kinds.get(type(field), "string"), field) for field in fields.values()]


def close_gateway_once(gateway: Any) -> None:
    """Make a ``dask_gateway.Gateway`` close only once (patching its ``close`` on this instance).

    Why a patch: its ``__del__`` closes it again, and a second close asks its stopped event loop for itself
    (``Accessing the loop property while the loop is not running``), printed as "Exception ignored …" on
    stderr when it comes from ``__del__`` (checked on dask-gateway 2026.3.0, distributed 2026.8.0).
    """
    first = gateway.close

    def close() -> Any:
        gateway.close = lambda: None  # an instance attribute: __del__'s self.close() finds this one
        return first()

    gateway.close = close


def format_gateway_template(value: Any) -> Any:
    """A ``gateway.*`` config value with ``{ENV_VAR}`` fields filled in from the environment, as dask-gateway does.

    Why internal: dask-gateway reads its address (and more) through the undocumented
    ``dask_gateway.utils.format_template``; using it keeps our reading of ``gateway.address`` the same as its own.
    """
    from dask_gateway.utils import format_template

    return format_template(value)


# --------------------------------------------------------------------------- Streamlit (the pages pass ``st`` in)
PAGE_LIST_OPTION = "client.showSidebarNavigation"


def show_streamlit_page_list(st: ModuleType) -> None:
    """Turn Streamlit's page list back on, just before the app's own ``st.navigation`` draws its menu.

    Why version-dependent: on Streamlit 1.67 a fresh server's first script run is made from the ``pages/``
    folder (``script_runner._mpa_v1``, the old multipage mode) and lists its files in the sidebar, unless
    ``.streamlit/config.toml`` sets ``client.showSidebarNavigation = false``. That option also hides a
    ``position="sidebar"`` navigation; it is a client option, so ``st.set_option`` may turn it back on at
    run time (process-wide), and by the app's ``st.navigation`` no folder listing can come again.
    """
    st.set_option(PAGE_LIST_OPTION, True)


def leave_streamlit_pages_folder(st: ModuleType, pages: Any) -> None:
    """End Streamlit's old pages-folder mode for this server process, and rerun the session through the entrypoint.

    Why version-dependent: until some session calls ``st.navigation``, Streamlit treats the top-level
    ``pages/`` folder as an old-style multipage folder (``PagesManager.uses_pages_directory``) and runs a
    page of it on its own: a first visitor arriving by a shared link would get that page without the app's
    sections. ``st.navigation`` clears that flag for the process, and ``st.rerun`` then runs the entrypoint
    for the same URL (Streamlit 1.67). Call ``st.set_page_config`` first. Raises Streamlit's rerun signal.
    """
    show_streamlit_page_list(st)
    st.navigation(pages)
    st.rerun()


# Messages that act on the whole server (Streamlit 1.67's ``AppSession.handle_backmsg``): ``clear_cache`` clears
# every session's caches; ``load_git_info`` tells the app folder's repository, branch and uncommitted files' names;
# two ``backend_operation_request`` payloads write files (the skills install and its nudge marker).
SERVER_WIDE_MESSAGES = frozenset({"clear_cache", "load_git_info"})
SERVER_WIDE_OPERATIONS = frozenset({"install_skills", "dismiss_skills_nudge"})
_GUARD_MARK = "_petmodel_guarded"


def server_wide_message(msg: Any) -> str | None:
    """The name of what a ``BackMsg`` asks of the whole server (see :data:`SERVER_WIDE_MESSAGES`), or None
    for a message that acts on its own session only (a rerun, a stop, a heartbeat, its own uploads and files)."""
    kind = msg.WhichOneof("type")
    if kind in SERVER_WIDE_MESSAGES:
        return kind
    if kind == "backend_operation_request":
        operation = msg.backend_operation_request.WhichOneof("payload")
        return operation if operation in SERVER_WIDE_OPERATIONS else None
    return None


def guard_server_wide_messages(st: ModuleType, allow: Callable[[str | None, Mapping[str, str]], bool]) -> None:
    """Drop every server-wide message (:func:`server_wide_message`) whose session ``allow(peer, headers)``
    refuses; idempotent, for the server process (``st``: the pages' Streamlit module).

    Why version-dependent: Streamlit 1.67 acts on ``BackMsg.clear_cache`` from any session, with no check of
    who sent it, and has no option to refuse it (issue 50). This wraps ``Runtime.handle_backmsg``, where the
    WebSocket handler hands over each message with the session's ``client``, whose ``client_context`` holds
    the peer and headers of the handshake (the TCP peer, or what uvicorn took from ``X-Forwarded-For``). A
    dropped message is logged, never answered. Without the guard a visitor's message clears only caches:
    the app keeps nothing there that work needs (``petmodel.app.server_state``).
    """
    import logging

    runtime_class, current = st.runtime.Runtime, st.runtime.Runtime.handle_backmsg
    if getattr(current, _GUARD_MARK, False):
        return

    def handle_backmsg(self: Any, session_id: str, msg: Any, *, client: Any = None) -> None:
        wanted = server_wide_message(msg)
        if wanted is not None:
            context = getattr(client if client is not None else self.get_client(session_id), "client_context", None)
            peer = getattr(context, "remote_ip", None)
            headers = {str(k).lower(): str(v) for k, v in (getattr(context, "headers", None) or ())}
            if not allow(peer, headers):
                logging.getLogger("petmodel.app").warning(
                    "Dropped %s from a session that is not the owner's (peer %s).", wanted, peer)
                return
        current(self, session_id, msg, client=client)

    setattr(handle_backmsg, _GUARD_MARK, True)
    runtime_class.handle_backmsg = handle_backmsg


# --------------------------------------------------------------------------- what only a message tells
OUT_OF_MEMORY_TYPES = frozenset({"OutOfMemoryError", "MemoryError"})  # torch's (CUDA) and Python's
_OUT_OF_MEMORY_TEXT = ("out of memory", "can't allocate memory")  # CUDA's and the CPU allocator's RuntimeError


def is_out_of_memory(type_name: str, summary: str) -> bool:
    """Whether an exception, known by its type's name and its one-line summary, says an allocator ran out of memory.

    Why by name and text: a rank's error reaches the supervisor summarised
    (:class:`petmodel.cluster.failures.RankError`); torch has a type only for CUDA's
    (``torch.OutOfMemoryError``, also ``torch.cuda.OutOfMemoryError``), Python's is ``MemoryError``, and the
    CPU allocator raises a plain ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory"), as do some
    CUDA paths ("CUDA out of memory"); checked on torch 2.13.
    """
    return type_name in OUT_OF_MEMORY_TYPES or any(t in summary.lower() for t in _OUT_OF_MEMORY_TEXT)


def is_untrusted_pickle(err: BaseException) -> bool:
    """Whether ``torch.load(weights_only=True)`` refused a file because its pickle asks to import a callable.

    Why by text: torch raises ``pickle.UnpicklingError`` both for that ("Trying to load unsupported GLOBAL
    posix.system …") and for bytes it cannot read ("Unsupported operand …"), told apart only by the message
    (checked on torch 2.13). The first means an untrusted file, the second a damaged one.
    """
    import pickle

    return isinstance(err, pickle.UnpicklingError) and "global" in str(err).lower()


def says_disk_full(err: BaseException) -> bool:
    """Whether ``err``'s message is one a library gives for a full disk where it gives no ``errno`` or code.

    Why by text: torch's zip writer (``torch.save``) reports a failed write as a plain ``RuntimeError``
    ("[enforce fail at inline_container.cc:…] … unexpected pos …", or "… file write failed"; checked on
    torch 2.13), the only trace of a full disk; "No space left" is the C library's words in an error
    re-raised without its errno.
    """
    text = str(err)
    return "No space left" in text or "inline_container" in text or "file write failed" in text
