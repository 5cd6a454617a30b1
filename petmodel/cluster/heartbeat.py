"""When a run's scheduler counts as lost: silent for longer than the run's own heartbeat allows.

The supervisor hears from the scheduler all the time: metric rows the ranks publish, the snapshot
queue's answers, the once-a-second check of which workers are alive. A fixed timeout on any one of
those calls (10 s, before) fails a run that is only slow: a scheduler paused for 25 s, a link at
256 kbit/s moving a snapshot, a loopback down for 20 s. So no single call decides. The run is lost
when *nothing* was heard for :meth:`Heartbeat.bound_s`: a multiple of the longest gap this run has
already lived through, never under :data:`SILENCE_MIN_S` nor over :data:`SILENCE_MAX_S`. Pure: the
clock is passed in, so the rule is tested without a cluster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

SILENCE_MIN_S = 45.0  # a paused scheduler or a flapping link comes back within this more often than not
SILENCE_MAX_S = 600.0  # however slow the run has been, ten silent minutes end it
GAP_MULTIPLE = 3.0  # the bound is this many times the longest gap the run already survived


@dataclass
class Heartbeat:
    """What the supervisor has heard, and when; ``beat`` on every answer from the scheduler."""

    heard_at: float = field(default_factory=time.monotonic)
    longest_gap_s: float = 0.0
    min_s: float = SILENCE_MIN_S
    max_s: float = SILENCE_MAX_S

    def beat(self, now: float | None = None) -> None:
        """Something came from the scheduler just now."""
        now = time.monotonic() if now is None else now
        self.longest_gap_s = max(self.longest_gap_s, now - self.heard_at)
        self.heard_at = max(self.heard_at, now)

    def silent_for(self, now: float | None = None) -> float:
        return max(0.0, (time.monotonic() if now is None else now) - self.heard_at)

    def bound_s(self) -> float:
        """How long a silence this run tolerates."""
        return min(self.max_s, max(self.min_s, GAP_MULTIPLE * self.longest_gap_s))

    def left_s(self, now: float | None = None) -> float:
        """How much of the bound is left: the most one call to the scheduler may wait now."""
        return max(0.0, self.bound_s() - self.silent_for(now))

    def lost(self, now: float | None = None) -> bool:
        return self.silent_for(now) > self.bound_s()
