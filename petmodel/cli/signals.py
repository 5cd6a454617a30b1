"""Ctrl-C and SIGTERM during ``train``: the first stops the run cleanly, the second quits at once.

A clean stop lets the ranks finish their step and the run save its snapshot, so ``--resume``
continues where it stopped; a batch job's SIGTERM (a scheduler's time limit) gets the same.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from petmodel.errors import PetmodelError


class Interrupted(PetmodelError):
    """The user stopped the command; it exits with 130 like an interrupted shell command."""


class StopOnSignals:
    """While active, SIGINT and SIGTERM set :attr:`event` (and call :attr:`on_stop`) the first time."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, *, quiet: bool = False) -> None:
        self.event = threading.Event()
        self.on_stop: Callable[[], Any] | None = None
        self.quiet = quiet
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.event.is_set():
            raise KeyboardInterrupt
        self.event.set()
        if not self.quiet:
            print("\nStopping after the current step and saving a snapshot (press Ctrl-C again to quit at once)…",
                  file=sys.stderr)
        if self.on_stop is not None:
            self.on_stop()
