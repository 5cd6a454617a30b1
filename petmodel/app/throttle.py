"""Back-off for admin password tries: per browser session and for the whole server.

A session may try :data:`FREE_TRIES` wrong passwords at once; after that each wrong try
doubles its wait (1 s, 2 s, 4 s, … up to :data:`MAX_WAIT_S`). A visitor can start a new
session by reloading, so the server keeps the same count over all sessions with a larger
allowance (:data:`SERVER_FREE_TRIES`): past it, every session waits. A right password clears
its session's count only, so a guesser cannot reset the server's count by knowing nothing.
Counts forget :data:`FORGET_AFTER_S` after the last wrong try.

Thread-safe (Streamlit runs sessions in threads); no Streamlit here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

FREE_TRIES = 3
SERVER_FREE_TRIES = 20
MAX_WAIT_S = 300.0
FORGET_AFTER_S = 3600.0
SERVER = "*server*"


@dataclass
class _Count:
    failures: int = 0
    last: float = 0.0


@dataclass
class PasswordThrottle:
    """Failures per key (a session id, and :data:`SERVER`); :meth:`wait_s` says how long until the next try."""

    free_tries: int = FREE_TRIES
    server_free_tries: int = SERVER_FREE_TRIES
    max_wait_s: float = MAX_WAIT_S
    _counts: dict[str, _Count] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _delay(self, key: str, now: float) -> float:
        count = self._counts.get(key)
        if count is None or now - count.last > FORGET_AFTER_S:
            return 0.0
        free = self.server_free_tries if key == SERVER else self.free_tries
        over = count.failures - free
        if over < 0:
            return 0.0
        return max(0.0, count.last + min(self.max_wait_s, 2.0 ** over) - now)

    def wait_s(self, session: str, now: float | None = None) -> float:
        """Seconds before ``session`` may try again (0: now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return max(self._delay(session, now), self._delay(SERVER, now))

    def failed(self, session: str, now: float | None = None) -> None:
        """Count a wrong password for ``session`` and for the server."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for key in (session, SERVER):
                count = self._counts.setdefault(key, _Count())
                if now - count.last > FORGET_AFTER_S:
                    count.failures = 0
                count.failures += 1
                count.last = now

    def succeeded(self, session: str) -> None:
        """A right password: forget this session's failures."""
        with self._lock:
            self._counts.pop(session, None)
