"""How much CPU the rest of the machine took from a timed run: a sweep's timings are only fair on idle cores."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed import Client

# Cores the rest of the machine may take during a timed run before the sweep flags it. DDP ranks
# run in lockstep, so a core taken from one rank for a moment stalls every rank.
BACKGROUND_CPU_WARN = 0.1


class BackgroundMeter:
    """CPU taken from a run by the rest of the machine while it trains.

    Only meaningful when the workers run on this machine (an embedded local cluster): then
    :meth:`cores` is (other processes' cores, cores stolen by the hypervisor) on average since
    the meter was made, either of which slows a run that needs every core. (None, None) when
    ``pids`` is None (remote workers).
    """

    def __init__(self, pids: Sequence[int] | None) -> None:
        import psutil

        self._psutil = psutil
        self.pids = list(pids) if pids else None
        self.start = self._sample() if self.pids is not None else None

    def _sample(self) -> tuple[float, float, float, float]:
        """(now, machine busy CPU seconds, this process's and the workers' CPU seconds, steal seconds)."""
        psutil = self._psutil
        t = psutil.cpu_times()
        busy = t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        ours = 0.0
        for pid in [os.getpid(), *(self.pids or [])]:
            try:
                c = psutil.Process(pid).cpu_times()
                ours += c.user + c.system
            except psutil.Error:
                pass
        return time.monotonic(), busy, ours, getattr(t, "steal", 0.0)

    def cores(self) -> tuple[float | None, float | None]:
        """(other processes' cores, stolen cores) on average since the meter started."""
        if self.start is None:
            return None, None
        end = self._sample()
        wall = end[0] - self.start[0]
        if wall <= 0:
            return None, None
        others = max(0.0, (end[1] - self.start[1]) - (end[2] - self.start[2])) / wall
        return round(others, 2), round(max(0.0, end[3] - self.start[3]) / wall, 2)


def local_worker_pids(client: Client) -> list[int] | None:
    """Pids of all the cluster's workers when they all run on this machine, else None."""
    from petmodel.cluster.workers import describe_workers

    local = {"127.0.0.1", "localhost", "::1", socket.gethostname()}
    try:
        local.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    try:
        workers = describe_workers(client)  # with the probe: it reports each worker's pid
    except Exception:  # noqa: BLE001 - no meter is better than no sweep
        return None
    if any(w.pid is None or w.host not in local for w in workers):
        return None
    return [int(w.pid) for w in workers]
