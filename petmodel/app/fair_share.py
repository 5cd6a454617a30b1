"""A fair share of the server for visitors: at most a few heavy visitor requests at a time, server-wide.

Name generation is the one thing a visitor can ask for that costs real compute (1,000 names "only new" are
thousands of sampled names). Forty visitors asking at once made each request take 3–21 s and the
owner's Home page 10.9 s (issue 50): every request ran at once, on two cores and one GIL. A visitor's
heavy request (more than :data:`LIGHT_NAMES` names: a slider move over 20 names stays free, so many visitors
browsing never queue) therefore waits for one of ``$PETMODEL_VISITOR_SLOTS`` turns (default 1) for at most
:data:`WAIT_S`, then gets one sentence instead. The owner and admins never wait here, and the turns
are a plain semaphore in the server process (``petmodel.app.server_state``), which no client message
can clear. No Streamlit here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from petmodel.errors import PetmodelError
from petmodel.settings import env_number

SLOTS_ENV = "PETMODEL_VISITOR_SLOTS"
DEFAULT_SLOTS = 1  # one visitor request at a time keeps a 2-core server's pages under 1 s with 40 visitors
WAIT_S = 30.0  # a visitor waits this long for a turn before being told to come back
LIGHT_NAMES = 100  # up to this many names a request is light: it never waits for a turn


class ServerBusy(PetmodelError):
    """Every visitor turn stayed taken for :data:`WAIT_S`: one sentence, nothing lost."""


def visitor_slots() -> int:
    """``$PETMODEL_VISITOR_SLOTS`` (a whole number ≥ 1), or :data:`DEFAULT_SLOTS` when unset; else one sentence."""
    return int(env_number(SLOTS_ENV, DEFAULT_SLOTS, kind=int, minimum=1, unit="requests"))


@dataclass
class VisitorTurns:
    """At most ``slots`` heavy visitor requests at once; :meth:`turn` waits up to ``wait_s`` for one."""

    slots: int = DEFAULT_SLOTS
    wait_s: float = WAIT_S
    _free: threading.BoundedSemaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._free = threading.BoundedSemaphore(self.slots)

    @contextmanager
    def turn(self, visitor: bool, names: int, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
        """Run the block (making and showing ``names`` names) in a visitor's turn; at once for the owner and
        admins (``visitor`` False) and for a light request (at most :data:`LIGHT_NAMES` names). ``on_wait`` is
        called once when the turn is not free at once (to tell the visitor), before waiting for it.

        Raises :class:`ServerBusy` when no turn came within ``wait_s``.
        """
        if not visitor or names <= LIGHT_NAMES:
            yield
            return
        if not self._free.acquire(blocking=False):
            if on_wait is not None:
                on_wait()
            if not self._free.acquire(timeout=self.wait_s):
                raise ServerBusy("The server is busy making names for other visitors; try again in a minute.")
        try:
            yield
        finally:
            self._free.release()
