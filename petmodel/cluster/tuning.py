"""Every knob that tunes Dask workers for training: torch threads, glibc malloc, Dask's monitors,
CPU pinning, and the process group's timeout.

Dask's defaults suit many small tasks on idle workers; a DDP rank is one long task that needs its
cores to itself and waits for the slowest rank at every step, so each knob here trades a Dask
default for steadier steps. What each one buys is measured in README's benchmark section
(``python -m benchmarks.bench_ddp`` and its ``--malloc dask`` / ``--no-pin`` / ``--dask-tune`` A/Bs).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import distributed
from distributed import WorkerPlugin

from petmodel.compat import set_default_process_group_timeout, worker_nthreads
from petmodel.settings import env_flag

PLUGIN_NAME = "petmodel-torch-threads"

# Dask settings for the workers start_local_cluster starts, on a machine whose cores the ranks need:
# - no fixed malloc trim threshold from the nanny (see undo_dask_malloc_trim);
# - the statistical profiler samples every 100 ms instead of 10 ms, and the memory and system
#   monitors run every 1 s / 2 s instead of 0.1 s / 0.5 s: each sample takes the worker's GIL and
#   CPU time the ranks need. The dashboard's profile and system plots stay, just coarser;
# - every server (scheduler, nannies, workers) checks its event loop every 500 ms instead of 20 ms:
#   the 20 ms tick is most of what an idle embedded cluster costs (it sits idle in the app all day),
#   and a blocked loop is still reported, only checked less often.
LOCAL_WORKER_CONFIG = {
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
    "distributed.worker.profile.interval": "100ms",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.admin.tick.interval": "500ms",
}


# Dask settings, on top of LOCAL_WORKER_CONFIG, for a cluster started to *time* training (the study
# CLI's embedded cluster): no statistical profiler at all and slower monitors, because on
# a machine with one core per rank any CPU they take stalls every rank at the next all-reduce.
TIMING_CLUSTER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "2s",
    "distributed.scheduler.work-stealing": False,  # rank tasks are pinned to their workers anyway
    "distributed.scheduler.active-memory-manager.start": False,
}


def undo_dask_malloc_trim() -> bool:
    """Give glibc back its adaptive malloc thresholds in this process, if a Dask nanny fixed them.

    Nannies start workers with ``MALLOC_TRIM_THRESHOLD_=65536`` so idle workers hand memory back
    to the OS. glibc then stops adapting its mmap threshold, and every tensor over 128 KiB in a
    training step becomes a fresh mmap/munmap with page faults, which slows every step.
    Training workers keep their working set, so we raise both thresholds instead (mmap 32 MiB,
    the most glibc's own adaptive threshold would reach; trim 128 MiB): step-sized tensors are
    then reused from the heap. Returns whether anything was changed.
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
        nthreads = worker_nthreads(worker)  # an undocumented attribute: petmodel.compat
        if nthreads:
            torch.set_num_threads(nthreads)
        undo_dask_malloc_trim()


@contextlib.contextmanager
def pinned_to_own_cpus(slot: int, host_workers: int, nthreads: int) -> Iterator[None]:
    """While a multi-rank CPU run trains, keep this worker process (all its threads) on its own cores.

    DDP steps wait for the slowest rank, so a rank whose core the kernel lends to another rank's
    gloo or Dask threads, or which it migrates, slows every rank. ``slot`` is this worker's index
    among the cluster's workers on its host, so concurrent runs on one host get different cores.
    Skipped when the worker is alone on its host (nothing to keep apart; the kernel spreads it best),
    when the host's workers do not fit its CPUs, or with ``PETMODEL_PIN_CPUS=0`` (or false/no/off); undone afterwards.
    """
    if (host_workers < 2 or not env_flag("PETMODEL_PIN_CPUS", True)
            or not hasattr(os, "sched_setaffinity")):
        yield
        return
    allowed = sorted(os.sched_getaffinity(0))
    if host_workers * nthreads > len(allowed):
        yield
        return
    mine = set(allowed[slot * nthreads:(slot + 1) * nthreads])

    def set_all(cpus: set[int] | list[int]) -> None:
        # Every thread of the process: threads started later inherit their creator's set.
        for tid in os.listdir(f"/proc/{os.getpid()}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)

    set_all(mine)
    try:
        yield
    finally:
        set_all(allowed)


def bound_process_group_timeout(seconds: float) -> None:
    """Lower the default timeout that ``init_process_group`` reads, in this (worker) process.

    ``dask_pytorch_ddp.dispatch.dispatch_with_ddp`` calls ``init_process_group(backend=...)``
    with no timeout and takes no option for one, so a rank whose peer never joins or died
    silently would wait torch's default of 30 minutes. ``init_process_group`` falls back to this
    module default (for the rendezvous and for every collective), so we set it, through
    :func:`petmodel.compat.set_default_process_group_timeout` (a torch internal);
    ``tests/test_compat.py`` fails if torch stops reading it.
    """
    set_default_process_group_timeout(seconds)
