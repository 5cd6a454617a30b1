"""Who drives a run or a study: the ``"host:pid"`` owner, whether that process still lives, and when to
give up on one that stopped reporting.

A run killed with the process that drove it (Ctrl-C, OOM, a closed terminal) would otherwise
show as running forever; the owner lets the store tell such orphans from live work. A process on
this host can be asked directly; one on another host cannot (a container restarted under a new
host name leaves its runs behind for good), so there the run's heartbeat decides: a run that has
not reported for longer than :func:`stale_run_seconds` is given up on.
"""

from __future__ import annotations

import os
import socket

from petmodel.settings import env_number

STALE_RUN_ENV = "PETMODEL_STALE_RUN_S"
DEFAULT_STALE_RUN_S = 600.0  # far above any quiet spell of a live run (a rendezvous, a long validation)


def current_owner() -> str:
    """``"hostname:pid"`` of this process: the ``owner`` that lets reconcile_orphans find dead runs."""
    return f"{socket.gethostname()}:{os.getpid()}"


def parse_owner(owner: str | None) -> tuple[str, int] | None:
    """``(host, pid)`` of an owner, or ``None`` when it cannot be read (no owner, or not ``host:pid``)."""
    host, _, pid_text = str(owner or "").rpartition(":")
    return (host, int(pid_text)) if host and pid_text.isdigit() else None


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

    Owners on other hosts are never orphans here: we cannot tell whether a remote process lives
    (:func:`stale_for` gives up on them by their heartbeat instead).
    """
    parsed = parse_owner(owner)
    if parsed is None or parsed[0] != socket.gethostname():
        return None
    return None if pid_alive(parsed[1]) else parsed[1]


def live_here(owner: str | None) -> int | None:
    """The pid of ``owner`` when it is a live process on this host: a run that is still being driven."""
    parsed = parse_owner(owner)
    if parsed is None or parsed[0] != socket.gethostname() or not pid_alive(parsed[1]):
        return None
    return parsed[1]


def stale_run_seconds() -> float:
    """How long a run driven from another host may stay silent before it counts as stopped (``$PETMODEL_STALE_RUN_S``).

    A malformed value is one UsageError sentence (:func:`petmodel.settings.env_number`), never the default.
    """
    return float(env_number(STALE_RUN_ENV, DEFAULT_STALE_RUN_S, above=0, unit="seconds"))


def stale_for(owner: str | None, heartbeat: float, now: float, bound: float, *,
              here: str | None = None) -> float | None:
    """Seconds since ``heartbeat`` when ``owner`` runs on another host (or cannot be read) and has been
    silent for longer than ``bound``; ``None`` while it may still be driving its run.

    Owners on this host (``here``, default this host's name) are never stale: :func:`is_orphan` asks the
    OS about them, which is exact, and a live local process may well be quiet for a while.
    """
    parsed = parse_owner(owner)
    if parsed is not None and parsed[0] == (here if here is not None else socket.gethostname()):
        return None
    silent = now - heartbeat
    return silent if silent > bound else None


def describe_owner(owner: str | None) -> str:
    """``"host X, pid N"``, or what is known of an owner that cannot be read, for a sentence."""
    parsed = parse_owner(owner)
    if parsed is not None:
        return f"host {parsed[0]}, pid {parsed[1]}"
    return f"owner {owner!r}" if owner else "no recorded owner"


def stale_sentence(what: str, item_id: str, owner: str | None, silent_s: float, *, resumable: bool) -> str:
    """The one sentence a run or study given up on by :func:`stale_for` is failed with: whose it was, how long
    it has been silent, and the way out (resume only where a snapshot exists)."""
    from petmodel.analysis import format_seconds  # one duration format everywhere; lazily, the store is light

    head = f"The process driving this {what} ({describe_owner(owner)}) stopped reporting {format_seconds(silent_s)} ago"
    if resumable:
        return f"{head}; resume it with `python -m petmodel train --resume {item_id}`, or delete it."
    if what == "run":
        return f"{head}; delete it with `python -m petmodel runs delete {item_id}`."
    return f"{head}; its finished runs are kept, and the Experiments page can delete it."
