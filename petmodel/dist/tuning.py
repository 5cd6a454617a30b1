"""How our workers are tuned for training: torch threads, glibc malloc, Dask monitors, CPU pinning,
and the process group's timeout. Every knob that trades Dask's defaults for training speed is here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import timedelta

import distributed
from distributed import WorkerPlugin

PLUGIN_NAME = "petmodel-torch-threads"

# Our own local workers are tuned for training on a machine whose cores the ranks need:
# - no fixed malloc trim threshold from the nanny (see undo_dask_malloc_trim: ~40% of a step);
# - the statistical profiler samples every 100 ms instead of 10 ms, and the memory and system
#   monitors run every 1 s / 2 s instead of 0.1 s / 0.5 s: each takes the worker's GIL, and on
#   2 cores Dask's machinery then used ~0.2 cores that the two ranks needed (~0.1 after).
#   The dashboard's profile and system plots stay, just coarser.
LOCAL_WORKER_CONFIG = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.worker.profile.interval": "100ms",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
}


# Dask settings for a cluster that is started to *time* training (the CLI's embedded cluster):
# the workers' statistical profiler (a stack sample of every thread each 10 ms) and the
# system/memory monitors take CPU from the ranks; on a machine with one core per rank that
# time stalls every rank at the next all-reduce.
TIMING_CLUSTER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.admin.tick.interval": "500ms",
    "distributed.worker.memory.monitor-interval": "2s",
    "distributed.scheduler.work-stealing": False,  # rank tasks are pinned to their workers anyway
    "distributed.scheduler.active-memory-manager.start": False,
}


def undo_dask_malloc_trim() -> bool:
    """Give glibc back its adaptive malloc thresholds in this process, if a Dask nanny fixed them.

    Nannies start workers with ``MALLOC_TRIM_THRESHOLD_=65536`` so idle workers hand memory back
    to the OS. glibc then stops adapting its mmap threshold, and every tensor over 128 KiB in a
    training step becomes a fresh mmap/munmap with page faults: steps measured ~45 ms instead
    of ~27 ms here. Training workers keep their working set, so we restore glibc's defaults
    (mmap threshold 32 MiB, trim threshold 128 MiB). Returns whether anything was changed.
    """
    if not os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: the variable means nothing here
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)) and bool(
        libc.mallopt(m_trim_threshold, 128 * 1024 * 1024))


class TorchThreadsPlugin(WorkerPlugin):
    """Prepare a worker for training when it starts: torch's thread count, glibc's malloc.

    Without the thread count every worker process on a machine starts one intra-op thread
    per core, so several DDP ranks on one machine oversubscribe the CPUs and run slower than
    one. The malloc step is :func:`undo_dask_malloc_trim`. Both are idempotent, so
    registering the plugin twice is fine.
    """

    def setup(self, worker: distributed.Worker) -> None:
        """Run in each worker (now and on every worker that joins later)."""
        try:
            import torch
        except ImportError:  # a worker without torch cannot train; nothing to tune
            return
        # Today's distributed keeps the count on the worker's state machine; older
        # versions had ``worker.nthreads``.
        state = getattr(worker, "state", None)
        nthreads = getattr(state, "nthreads", None) or getattr(worker, "nthreads", None)
        if nthreads:
            torch.set_num_threads(int(nthreads))
        undo_dask_malloc_trim()


@contextlib.contextmanager
def pinned_to_own_cpus(slot: int, host_workers: int, nthreads: int) -> Iterator[None]:
    """While a multi-rank CPU run trains, keep this worker process (all its threads) on its own cores.

    DDP steps wait for the slowest rank, so a rank whose core the kernel lends to another rank's
    gloo or Dask threads, or which it migrates, slows every rank: with 2 workers on 2 cores,
    pinned workers measured 1.88× one worker's samples/s against 1.65× unpinned a few minutes
    earlier (batch 256, ``python -m benchmarks.bench_ddp``; ``--no-pin`` for the A/B). ``slot`` is this worker's index among the cluster's
    workers on its host, so concurrent runs on one host get different cores. Skipped when the
    host's workers do not fit its CPUs, or with ``PETMODEL_PIN_CPUS=0``; undone afterwards.
    """
    if os.environ.get("PETMODEL_PIN_CPUS", "1") == "0" or not hasattr(os, "sched_setaffinity"):
        yield
        return
    allowed = sorted(os.sched_getaffinity(0))
    if host_workers * nthreads > len(allowed):
        yield
        return
    mine = set(allowed[slot * nthreads:(slot + 1) * nthreads])

    def set_all(cpus: set[int] | list[int]) -> None:
        for tid in os.listdir(f"/proc/{os.getpid()}/task"):  # threads started later inherit their creator's set
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)

    set_all(mine)
    try:
        yield
    finally:
        set_all(allowed)


def bound_process_group_timeout(seconds: float) -> None:
    """Lower the default timeout that ``init_process_group`` reads, in this (worker) process.

    ``dask_pytorch_ddp.dispatch.dispatch_with_ddp`` calls ``init_process_group`` without a
    timeout, so a rank whose peer died silently would wait torch's default 30 minutes. There is
    no public way to pass one through it: we set the module default it reads (checked by
    ``tests/test_cluster.py::test_process_group_timeout_patch_reaches_torch``).
    """
    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timedelta(seconds=seconds)
    if hasattr(c10d, "default_pg_nccl_timeout"):
        c10d.default_pg_nccl_timeout = timedelta(seconds=seconds)
