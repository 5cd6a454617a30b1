"""How many compute threads training in this process uses: the cores free when it starts, not every core.

Why: torch starts one OpenMP thread per core, and the threads of an LSTM step meet at a barrier after
every small parallel region. When another process keeps one of two cores busy, the thread that shares
its core runs only in the time slices the kernel gives it, and every region waits for it: default
training fell to 17% of its quiet samples/s beside one busy process (issue 52; 28–38% on an AVX2 EPYC),
while one thread on the free core kept that core's full speed. So an in-process run samples
``/proc/stat`` for 0.2 s at its start, counts the cores of this process's CPU set that were idle (or
busy with this process), and uses that many threads (a core counts when 60% of it is free): at least
1, at most torch's own default (which ``OMP_NUM_THREADS`` sets). ``$PETMODEL_THREADS`` overrides the
choice; where ``/proc/stat`` cannot be read, torch's default stands.

Not done, because it did not pay (measured on 2 cores): ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep at
the barrier instead of spinning) made two threads beside a busy process faster, but no faster than one
thread, and cost 20–30% of the quiet speed. The choice is made once: a process that starts spinning
mid-run is not seen.

Torch-free at import (torch loads when a choice is applied).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Collection
from dataclasses import dataclass

from petmodel.config import counted
from petmodel.settings import env_number

__all__ = ["THREADS_ENV", "CpuSample", "ThreadChoice", "choose_threads", "free_cores", "read_sample",
           "torch_default_threads", "use_free_cores"]

THREADS_ENV = "PETMODEL_THREADS"
SAMPLE_S = 0.2  # long enough for ~20 clock ticks per core, short beside a run's start-up
CORE_FREE_SHARE = 0.6  # a core shared with another process gets a thread when this much of it is free


@dataclass(frozen=True)
class CpuSample:
    """Clock ticks so far: idle and total over the CPUs this process may run on, and this process's own."""

    idle: int
    total: int
    own: int
    cpus: int


def _allowed_cpus() -> Collection[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return range(os.cpu_count() or 1)


def read_sample(stat: str = "/proc/stat", own: str = "/proc/self/stat") -> CpuSample | None:
    """The tick counters now, or None where they cannot be read (not Linux)."""
    cpus = {f"cpu{n}" for n in _allowed_cpus()}
    idle = total = seen = 0
    try:
        with open(stat) as f:
            for line in f:
                name, *fields = line.split()
                if name in cpus:
                    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
                    idle += ticks[3] + ticks[4]
                    total += sum(ticks)
                    seen += 1
        with open(own) as f:
            rest = f.read().rpartition(")")[2].split()
        own_ticks = int(rest[11]) + int(rest[12])  # utime, stime of every thread of this process
    except (OSError, ValueError, IndexError):
        return None
    return CpuSample(idle, total, own_ticks, seen) if seen else None


def free_cores(before: CpuSample, after: CpuSample) -> float | None:
    """Cores that no other process used between two samples (steal counts as used); None if no time passed."""
    ticks = after.total - before.total
    if ticks <= 0 or before.cpus != after.cpus:
        return None
    free_share = (after.idle - before.idle + after.own - before.own) / ticks
    return min(1.0, max(0.0, free_share)) * after.cpus


def choose_threads(free: float | None, limit: int) -> int:
    """Threads for ``free`` cores, at least 1 and at most ``limit`` (unknown: ``limit``).

    A partly busy core counts when at least :data:`CORE_FREE_SHARE` of it is free: on 2 cores, two
    threads beside a process using a quarter of a core trained 7% faster than one thread, beside half a
    core 10% slower, and beside a whole core 2.2× slower (medians of 3)."""
    if free is None:
        return max(1, limit)
    return max(1, min(limit, int(free + 1 - CORE_FREE_SHARE)))


@functools.cache
def torch_default_threads() -> int:
    """Torch's thread count before this module first changed it: the cap, however often a choice is made."""
    import torch

    return torch.get_num_threads()


@dataclass(frozen=True)
class ThreadChoice:
    """What :func:`use_free_cores` chose: ``threads``, out of at most ``limit``, for ``free`` cores
    (None: not measured, or overridden by ``$PETMODEL_THREADS``)."""

    threads: int
    limit: int
    free: float | None = None
    overridden: bool = False

    def note(self) -> str | None:
        """One sentence when the run trains on fewer threads than torch would have used, else None."""
        if self.overridden or self.free is None or self.threads >= self.limit:
            return None
        return (f"training on {counted(self.threads, 'thread')}, not {self.limit}: only {self.free:.1f} of the "
                f"cores were free at the start (${THREADS_ENV} sets the number).")


def use_free_cores(sample_s: float = SAMPLE_S) -> ThreadChoice:
    """Set torch's thread count for training here: ``$PETMODEL_THREADS``, else the cores free now."""
    wanted = env_number(THREADS_ENV, None, kind=int, minimum=1, unit="threads")
    limit = torch_default_threads()
    if wanted is not None:
        choice = ThreadChoice(wanted, limit, overridden=True)
    elif limit <= 1:
        choice = ThreadChoice(1, limit)  # nothing to choose: no need to wait for a sample
    else:
        before = read_sample()
        time.sleep(sample_s)
        after = read_sample()
        free = free_cores(before, after) if before and after else None
        choice = ThreadChoice(choose_threads(free, limit), limit, free)
    import torch

    torch.set_num_threads(choice.threads)
    return choice
