"""Who drives a run or a study: the ``"host:pid"`` owner, and whether that process still lives.

A run killed with the process that drove it (Ctrl-C, OOM, a closed terminal) would otherwise
show as running forever; the owner lets the store tell such orphans from live work.
"""

from __future__ import annotations

import os
import socket


def current_owner() -> str:
    """``"hostname:pid"`` of this process: the ``owner`` that lets reconcile_orphans find dead runs."""
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """True unless the OS says no such process; anything unclear counts as alive (never reap wrongly)."""
    if pid <= 0:
        return True
    if os.name == "nt":  # os.kill(pid, 0) would terminate the process on Windows
        import psutil

        return psutil.pid_exists(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive but someone else's
        return True
    return True


def is_orphan(owner: str | None) -> int | None:
    """The pid of ``owner`` when it ran on this host and is gone; ``None`` when it may still live.

    Owners on other hosts are never orphans here: we cannot tell whether a remote process lives.
    """
    owner_host, _, pid_text = str(owner or "").rpartition(":")
    if owner_host != socket.gethostname() or not pid_text.isdigit():
        return None
    pid = int(pid_text)
    return None if pid_alive(pid) else pid
