"""Back-off for admin password tries: per client address and for the whole server.

Only visitors ever type the password (the owner, on the server's own machine, gets the app without
one: ``petmodel.app.access``), so nothing here can lock the owner out. With
``PETMODEL_LOOPBACK_IS_OWNER=0`` (a shared machine) there is no owner, and the machine's users share
one client key, ``access.THIS_MACHINE``.
Tries are counted per client key (``access.client_key``: one per machine as far as a request tells),
not per session: a reload starts a new session but keeps the address. A client may try
:data:`FREE_TRIES` wrong passwords at once; after that each wrong try doubles its wait (1 s, 2 s,
4 s, … up to :data:`MAX_WAIT_S`), and one client's wrong tries never slow another. Against a
guesser with many addresses, the server also counts over all clients: past
:data:`SERVER_FREE_TRIES` wrong tries in the hour, checks anywhere are spaced :data:`SERVER_SPACING_S`
apart. That bounds the guesser's rate without locking out a host that knows the password: it waits
a second at most. A right password clears its client's count only, so a guesser cannot reset the
server's count by knowing nothing. Counts forget :data:`FORGET_AFTER_S` after the last wrong try.

One throttle per server process (``petmodel.app.server_state``), outside Streamlit's caches, which any
session can clear. Thread-safe (Streamlit runs sessions in threads); no Streamlit here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

FREE_TRIES = 3
SERVER_FREE_TRIES = 100  # all clients together, in the hour
SERVER_SPACING_S = 1.0  # past that, at most one check a second for the whole server
MAX_WAIT_S = 300.0
FORGET_AFTER_S = 3600.0
SERVER = "*server*"


@dataclass
class _Count:
    failures: int = 0
    last: float = 0.0


@dataclass
class PasswordThrottle:
    """Failures per key (a client key, and :data:`SERVER`); :meth:`wait_s` says how long until the next try."""

    free_tries: int = FREE_TRIES
    server_free_tries: int = SERVER_FREE_TRIES
    server_spacing_s: float = SERVER_SPACING_S
    max_wait_s: float = MAX_WAIT_S
    _counts: dict[str, _Count] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _delay(self, key: str, now: float) -> float:
        count = self._counts.get(key)
        if count is None or now - count.last > FORGET_AFTER_S:
            return 0.0
        if key == SERVER:
            wait = self.server_spacing_s if count.failures >= self.server_free_tries else 0.0
        else:
            over = count.failures - self.free_tries
            wait = min(self.max_wait_s, 2.0 ** over) if over >= 0 else 0.0
        return max(0.0, count.last + wait - now) if wait else 0.0

    def wait_s(self, client: str, now: float | None = None) -> float:
        """Seconds before ``client`` may try again (0: now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return max(self._delay(client, now), self._delay(SERVER, now))

    def failed(self, client: str, now: float | None = None) -> None:
        """Count a wrong password for ``client`` and for the server."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for key in (client, SERVER):
                count = self._counts.setdefault(key, _Count())
                if now - count.last > FORGET_AFTER_S:
                    count.failures = 0
                count.failures += 1
                count.last = now

    def succeeded(self, client: str) -> None:
        """A right password: forget this client's failures."""
        with self._lock:
            self._counts.pop(client, None)
