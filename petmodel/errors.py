"""The one exception type users are meant to read.

Every expected failure (bad file, bad hyperparameter, unreachable scheduler, ...) is raised
as :class:`PetmodelError` whose message is one plain sentence saying what is wrong and what
to do. The CLI and the app print that sentence and nothing else; any other exception is a
bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import sqlite3

from petmodel.compat import says_disk_full


class PetmodelError(Exception):
    """A failure the user can fix; ``str(err)`` is one sentence meant for them."""


class UsageError(PetmodelError):
    """Bad input to a command or form (an impossible hyperparameter, say): CLI exit code 2."""


class UnsupportedPrecision(PetmodelError):
    """The device a run would train on cannot compute in the precision asked for (bf16 on most AVX2 CPUs)."""


def first_line(err: BaseException, *, typed: bool = False, limit: int | None = None) -> str:
    """The first line of ``err``'s message, stripped, for quoting another library's error in one sentence.

    An empty message gives the type's name; ``typed`` puts the type's name first (``"KeyError: 'x'"``);
    ``limit`` cuts the result to that many characters. A multi-line message (a remote traceback, say)
    keeps only its first line.
    """
    lines = str(err).strip().splitlines()
    name = type(err).__name__
    text = (f"{name}: {lines[0].strip()}" if typed else lines[0].strip()) if lines else name
    return text if limit is None else text[:limit]


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` means the disk (or the user's quota) is full, however the library said it.

    torch's zip writer reports a failed write as ``RuntimeError: [enforce fail at
    inline_container.cc…]`` and SQLite as ``SQLITE_FULL``; neither tells a user what
    to do, so callers turn these into one sentence.
    """
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if sqlite_code(err) == sqlite3.SQLITE_FULL:
        return True
    return says_disk_full(err)  # torch's zip writer raises a RuntimeError whose text is all there is to go by


class StoreBusy(PetmodelError):
    """The run store refused a write for now (locked by another process, or its disk full): a later try may
    work, so a run keeps its rows and tries again for a while before it fails for it."""


def sqlite_code(err: BaseException) -> int | None:
    """The primary SQLite result code of ``err`` (``sqlite3.SQLITE_BUSY``, ``SQLITE_FULL``, …; extended codes
    folded into theirs), or None for an error SQLite itself did not raise: decisions go by code, never by text."""
    code = getattr(err, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


class WorkerSilent(PetmodelError):
    """A worker did not answer a bounded call in time (frozen or overloaded): asking it more would hang too."""


class WorkerCallFailed(PetmodelError):
    """A worker answered a bounded call with an error, or left the cluster during it."""


class SchedulerSilent(PetmodelError):
    """The scheduler did not answer a bounded call in time: nothing more can be asked of the cluster now."""


class LaunchCancelled(PetmodelError):
    """A launch was cancelled (by the user, or a disconnect) while it waited for free workers."""
