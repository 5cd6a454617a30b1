"""Ask the scheduler about its workers: one function, :func:`describe_workers`, for every caller.

Training runs one DDP rank per Dask worker, so the order matters: workers come back in natural
address order, the same on every call, which is the rank order. :func:`cpu_slots` turns that
list into each worker's share of its host's CPUs, for pinning ranks to their own cores.
"""

from __future__ import annotations

import collections
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from distributed import Client

from petmodel.cluster import registry
from petmodel.cluster.calls import NoAnswer, run_each
from petmodel.compat import client_running, scheduler_identity
from petmodel.errors import PetmodelError, UsageError
from petmodel.settings import require_whole


@dataclass(frozen=True)
class WorkerInfo:
    """One Dask worker as training sees it: where it is and what it can compute with."""

    address: str
    name: str
    host: str
    nthreads: int
    memory_limit: int  # bytes; 0 when the worker reports no limit
    gpu_count: int
    gpu_name: str | None
    pid: int | None
    responsive: bool = True  # False: it did not answer the GPU probe in time (frozen or overloaded)
    gpu_uuid: str | None = None  # the UUID of the GPU it trains on; None without a GPU or a UUID to read

    @property
    def has_gpu(self) -> bool:
        """Whether this worker trains on CUDA tensors (its rank's device is a GPU)."""
        return self.gpu_count > 0

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-ready fields (for the app's tables and run metadata)."""
        return asdict(self)


def _gpu_probe() -> tuple[int, str | None, int, str | None]:
    """Run on a worker: ``(gpu count, first GPU's name or None, worker pid, its GPU's UUID or None)``.

    The UUID is that of the worker's current device, the one a rank of a single-GPU worker (dask-cuda's,
    or any on a one-GPU host) trains on: two workers that report the same UUID on one host share a GPU.
    """
    pid = os.getpid()
    try:
        import torch

        count = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
        name = torch.cuda.get_device_name(0) if count else None
    except Exception:  # no torch or a broken driver: the worker just has no usable GPU
        return 0, None, pid, None
    return count, name or None, pid, _current_gpu_uuid() if count else None


def _current_gpu_uuid() -> str | None:
    """The UUID of this process's current CUDA device, or None where torch or the driver gives none."""
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    except Exception:  # an old torch or driver without UUIDs: the backend choice then stays conservative
        return None
    return str(uuid) if uuid is not None else None


def _read_probe(probe: Any) -> tuple[int, str | None, int | None, str | None]:
    """A probe's answer as ``(count, name, pid, uuid)``; an older 3-field answer or none reads as no UUID."""
    if isinstance(probe, tuple) and len(probe) in (3, 4):
        count, name, pid, *rest = probe
        return count, name, pid, rest[0] if rest else None
    return 0, None, None, None


def ddp_backend(workers: Sequence[WorkerInfo]) -> str:
    """The process-group backend for ranks on ``workers``: ``"nccl"`` or ``"gloo"``.

    NCCL only when every rank has a GPU of its own: each worker sees a GPU, its UUID is known, and no
    two workers on one host report the same UUID. NCCL needs one GPU per rank (two ranks on one GPU fail
    at the first collective: "Duplicate GPU detected"), and a worker without a UUID may share its GPU.
    Everything else runs over gloo, which still carries CUDA tensors when the ranks train on GPUs (its
    all-reduce and broadcast, all DDP uses, copy through host memory): slower, but it runs. Workers that
    each see several GPUs (no dask-cuda) all report device 0's UUID, so they get gloo too: conservative.
    """
    if not workers or not all(w.has_gpu for w in workers):
        return "gloo"
    gpus = [(w.host, w.gpu_uuid) for w in workers]
    if any(uuid is None for _, uuid in gpus) or len(set(gpus)) < len(gpus):
        return "gloo"
    return "nccl"


def _natural_key(address: str) -> list[Any]:
    """Sort key so that ``...:9`` comes before ``...:10`` (and hosts likewise)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", address)]


def _require_running(client: Client) -> None:
    if not client_running(client):
        raise PetmodelError(
            f"The Dask client is {client.status}, not running; connect to the cluster again."
        )


def _positive_timeout(value: object) -> float:
    """``value`` as seconds, or a UsageError that names the bad value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UsageError(f"timeout must be a positive number of seconds, not {value!r}.")
    return float(value)


def describe_workers(
    client: Client, *, timeout: float = 10.0, probe_gpus: bool = True
) -> list[WorkerInfo]:
    """Every worker of the cluster, in natural address order (the DDP rank order).

    Reads addresses, threads and memory from the scheduler and asks each worker for its
    GPUs (skipped with ``probe_gpus=False``, for callers that only count or list workers,
    which then see ``gpu_count=0``). A worker whose GPU probe fails (or takes longer than
    ``timeout``) is reported with no GPU rather than failing the whole description. Raises
    PetmodelError when the client is closed or the scheduler does not answer in ``timeout``.
    """
    timeout = _positive_timeout(timeout)
    _require_running(client)
    try:
        # ``client.scheduler_info()`` would do, but cannot be bounded by a timeout and
        # silently returns a stale cache when the scheduler is unreachable (petmodel.compat).
        identity = scheduler_identity(client, timeout=timeout)
    except OSError as err:
        raise PetmodelError(
            f"The Dask scheduler did not describe its workers within {timeout:g} s; check "
            "that it is still running."
        ) from err
    workers: dict[str, dict[str, Any]] = identity.get("workers", {})
    probes: dict[str, Any] = {}
    if workers and probe_gpus:
        # Each worker on its own: a frozen one then costs only its own answer, not everyone's.
        probes = run_each(client, _gpu_probe, list(workers), timeout=timeout)
        silent = [a for a, v in probes.items() if isinstance(v, NoAnswer)]
        if silent:
            warnings.warn(
                f"Worker(s) {', '.join(silent)} did not report their GPUs; assuming none.",
                RuntimeWarning,
                stacklevel=2,
            )
    infos = []
    for address in sorted(workers, key=_natural_key):
        meta = workers[address]
        probe = probes.get(address)
        gpu_count, gpu_name, pid, gpu_uuid = _read_probe(probe)
        infos.append(
            WorkerInfo(
                address=address,
                name=str(meta.get("name", address)),
                host=str(meta.get("host") or address.split("://")[-1].rsplit(":", 1)[0]),
                nthreads=int(meta.get("nthreads") or 0),
                memory_limit=int(meta.get("memory_limit") or 0),
                gpu_count=gpu_count,
                gpu_name=gpu_name,
                pid=pid if pid is not None else meta.get("pid"),
                responsive=not (probe_gpus and isinstance(probe, NoAnswer)),
                gpu_uuid=gpu_uuid,
            )
        )
    return infos


def cpu_slots(workers: Sequence[WorkerInfo]) -> dict[str, tuple[int, int]]:
    """Each worker's ``(index among its host's workers, number of workers on its host)``.

    The index follows ``workers``' order, so with :func:`describe_workers`' stable order two
    runs on one host never pick the same cores (see :func:`~petmodel.cluster.tuning.pinned_to_own_cpus`).
    """
    by_host: dict[str, list[str]] = collections.defaultdict(list)
    for w in workers:
        by_host[w.host].append(w.address)
    return {a: (i, len(addrs)) for addrs in by_host.values() for i, a in enumerate(addrs)}


def worker_addresses(client: Client, *, timeout: float = 10.0) -> list[str]:
    """The workers' addresses in rank order, from the scheduler alone (asks no worker)."""
    return [w.address for w in describe_workers(client, timeout=timeout, probe_gpus=False)]


def choose_workers(client: Client, n: int, *, addresses: Sequence[str] | None = None,
                   described: Sequence[WorkerInfo] | None = None) -> list[WorkerInfo]:
    """N free workers in a stable order (rank i = i-th); explicit ``addresses`` keep their order.

    Free means not held by a run this process drives (:func:`petmodel.cluster.registry.busy_workers`);
    explicit ``addresses`` are taken as given. ``described``: the cluster's workers when the
    caller already asked the scheduler for them. Raises UsageError for a bad ``n`` and
    PetmodelError, one sentence, when the cluster cannot provide the workers.
    """
    require_whole("Workers", n)
    workers = list(described) if described is not None else describe_workers(client)
    if addresses:
        by_addr = {w.address: w for w in workers}
        missing = [a for a in addresses if a not in by_addr]
        if missing:
            raise PetmodelError(f"Worker {missing[0]} is not in the cluster; pick from the current workers.")
        silent = [a for a in addresses if not by_addr[a].responsive]
        if silent:
            raise PetmodelError(f"Worker {silent[0]} does not answer (frozen or overloaded); pick other workers.")
        return [by_addr[a] for a in addresses]
    if n > len(workers):
        raise PetmodelError(f"Asked for {n} workers but the cluster has {len(workers)}; "
                            "start more workers or ask for fewer.")
    busy = registry.busy_workers()
    free = [w for w in workers if w.address not in busy and w.responsive]
    if n > len(free):
        silent = [w.address for w in workers if not w.responsive]
        why = f"the others are training or do not answer ({', '.join(silent)})" if silent else "the others are training"
        raise PetmodelError(f"Asked for {n} workers but only {len(free)} of the cluster's {len(workers)} are free "
                            f"({why}); wait for a run to finish or ask for fewer.")
    # Group ranks by host so local ranks are contiguous (and rank 0 is the first host's first worker).
    return sorted(free[:n], key=lambda w: (w.host, free.index(w)))


def check_precision_on(client: Client, precision: str, addresses: Sequence[str], *, timeout: float) -> None:
    """Refuse bf16, naming the worker, when a worker that would train cannot run it (see
    :mod:`petmodel.precision`); each worker probes its own device once per process."""
    if precision != "bf16":
        return
    from petmodel.cluster.calls import require_answers
    from petmodel.errors import UnsupportedPrecision
    from petmodel.precision import unsupported_sentence, worker_bf16_probe

    answers = run_each(client, worker_bf16_probe, addresses, timeout=timeout)
    require_answers(answers, timeout, "checking whether it runs bf16")
    for address, answer in answers.items():
        if not answer["supported"]:
            raise UnsupportedPrecision(unsupported_sentence(f"worker {address}'s", answer["device"]))
