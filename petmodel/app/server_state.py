"""What the app server owns for every session: one backend per store folder, the password throttle, the
visitors' turns.

These live in this module, not in ``st.cache_resource``: Streamlit lets any connected session clear its
caches with one message (``BackMsg.clear_cache``, sent by any visitor, with no check of who sent it), and
clearing a cached backend cancelled the owner's runs, stopped the cluster and reset the password
back-off (issue 50). A module global is out of reach of every client message. They are built on first
use, under one lock, and live until the process ends (``AppBackend``'s ``atexit`` closes backends) or a
test calls :func:`reset`.
"""

from __future__ import annotations

import threading

from petmodel.app.backend import AppBackend, shutdown_all
from petmodel.app.fair_share import VisitorTurns, visitor_slots
from petmodel.app.throttle import PasswordThrottle

_lock = threading.Lock()
_backends: dict[str, AppBackend] = {}
_throttle = PasswordThrottle()
_turns: VisitorTurns | None = None


def backend_for(store_root: str) -> AppBackend:
    """The process-wide backend of the store folder ``store_root`` (built on first use)."""
    with _lock:
        backend = _backends.get(store_root)
        if backend is None:
            backend = _backends[store_root] = AppBackend(store_root)
        return backend


def password_throttle() -> PasswordThrottle:
    """The process-wide back-off for wrong admin passwords."""
    return _throttle


def visitor_turns() -> VisitorTurns:
    """The process-wide turns for heavy visitor requests, sized by ``$PETMODEL_VISITOR_SLOTS`` when first used
    (a bad value is one UsageError sentence, and nothing is built)."""
    global _turns
    with _lock:
        if _turns is None:
            _turns = VisitorTurns(visitor_slots())
        return _turns


def reset() -> None:
    """Close every backend and forget the throttle's counts and the turns: for tests, which start many
    apps in one process (a server never calls this)."""
    global _throttle, _turns
    shutdown_all()
    with _lock:
        _backends.clear()
        _throttle = PasswordThrottle()
        _turns = None
