"""The project's Dask client: one that can own its cluster, stops its own event loop, and carries what
:func:`petmodel.cluster.connect.connect` found out about the cluster."""

from __future__ import annotations

import asyncio
import threading
from contextlib import suppress
from typing import Any

from distributed import Client
from tornado.ioloop import IOLoop

from petmodel.compat import bounded_start_kwargs, dask_errors_in_one_line


class _EventLoopThread:
    """An event loop on a daemon thread that this module starts and stops itself.

    Handed to ``Client(loop=...)``: a client never stops a running loop it did not create, so
    the loop's lifetime is ours, and we can end it even after a failed start, when
    ``Client.close`` does nothing (the client already counts itself closed) and the client's
    own loop thread would stay behind for the life of the process.
    """

    def __init__(self) -> None:
        ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self.loop: IOLoop | None = None

        async def main() -> None:
            self._aloop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self.loop = IOLoop.current()
            ready.set()
            await self._stop.wait()  # asyncio.run then cancels what is left and closes the loop

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True,
                                        name="petmodel client loop")
        self._thread.start()
        if not ready.wait(10) or self.loop is None:
            raise RuntimeError("The Dask client's event loop did not start.")

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop and its thread; safe to call twice."""
        if self._thread.is_alive() and self._aloop is not None and self._stop is not None:
            with suppress(RuntimeError):  # the loop closed in the meantime
                self._aloop.call_soon_threadsafe(self._stop.set)
            if threading.current_thread() is not self._thread:
                self._thread.join(timeout)


class PetmodelClient(Client):
    """A ``distributed.Client`` that can own a cluster and cleans up after a failed start.

    Two gaps in ``distributed.Client`` (checked on 2026.8.0) make this worth a subclass:
    ``Client(cluster).close()`` leaves ``cluster`` running, and a ``Client(address)`` whose
    start fails leaves its event-loop thread running (and a server that accepts the TCP
    connection but never answers makes the start hang despite ``timeout=``). With
    ``own_loop=True`` the client runs on an :class:`_EventLoopThread` that :meth:`close`,
    and a failed start, stop.
    """

    # What connect() found out, for the Cluster page and later launches (None on an embedded cluster).
    petmodel_versions: list[dict[str, Any]] | None = None  # petmodel.cluster.versions.collect's rows
    petmodel_code_hash: str | None = None  # the code shipped at connect (petmodel.cluster.shipping.ship)

    def __init__(
        self, *args: Any, start_limit: float | None = None, own_loop: bool = False, **kwargs: Any
    ) -> None:
        dask_errors_in_one_line()  # the process driving runs prints our sentences, not Dask's tracebacks
        # Set before ``Client.__init__``, which calls :meth:`start`.
        self._petmodel_start_limit = start_limit
        self._petmodel_cluster: Any = None
        self._petmodel_loop = _EventLoopThread() if own_loop else None
        if self._petmodel_loop is not None:
            kwargs["loop"] = self._petmodel_loop.loop
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self._stop_own_loop()
            raise

    def start(self, **kwargs: Any) -> None:
        """Start as usual, bounded overall by ``start_limit``; on failure, close what it left."""
        if self._petmodel_start_limit is not None and not self.asynchronous:
            # Bounds the whole start, not only the connection attempts (how: petmodel.compat).
            kwargs = bounded_start_kwargs(kwargs, self._petmodel_start_limit)
        try:
            super().start(**kwargs)
        except BaseException:
            with suppress(Exception):
                Client.close(self, timeout=2)
            self._stop_own_loop()
            raise

    def _stop_own_loop(self) -> None:
        if self._petmodel_loop is not None:
            self._petmodel_loop.stop()

    def own(self, cluster: Any) -> None:
        """Make :meth:`close` also close ``cluster``."""
        self._petmodel_cluster = cluster

    def close(self, *args: Any, **kwargs: Any) -> Any:
        """Close the client, then the cluster and the event loop it owns (if any)."""
        try:
            return super().close(*args, **kwargs)
        finally:
            cluster, self._petmodel_cluster = self._petmodel_cluster, None
            try:
                if cluster is not None:
                    cluster.close()
            finally:
                self._stop_own_loop()


