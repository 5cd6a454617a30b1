"""What runs on each Dask worker during a DDP run: the rank's entry point and its metric emitter.

``dask_pytorch_ddp.dispatch.run`` cannot be used as it stands: it takes every worker of the
cluster, a fixed port (so two runs collide), and passes positional arguments that collide with
``client.submit``'s. So we keep its per-worker entry, ``dispatch_with_ddp`` (which sets up and
tears down the process group), and :mod:`petmodel.cluster.launch` chooses workers, ranks and port.
Metrics travel as Dask events (``dask_pytorch_ddp.results`` needs a module distributed removed).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import distributed

from petmodel.config import RunSpec
from petmodel.cluster.tuning import bound_process_group_timeout, pinned_to_own_cpus
from petmodel.compat import worker_nthreads
from petmodel.status import StopReason

if TYPE_CHECKING:
    from petmodel.data import NameCorpus
    from petmodel.trainstate import TrainState

log = logging.getLogger(__name__)

EMIT_EVERY_S = 0.5  # ranks batch their per-step rows into one event this often: each event costs GIL time
CANCEL_POLL_S = 0.5  # how often a rank asks the scheduler whether its run was cancelled


def free_port() -> int:
    """Runs on rank 0's worker: a TCP port that is free there right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class _EventEmitter:
    """Batches metric rows and publishes them as one Dask event per interval.

    A validation row and the first step go out at once, so the client sees a run start and
    each validation without waiting for the interval.
    """

    def __init__(self, topic: str) -> None:
        self.worker = distributed.get_worker()
        self.topic = topic
        self.rows: list[dict[str, Any]] = []
        self.last = time.monotonic()

    def __call__(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        first_step = len(self.rows) == 1 and row.get("step") == 1
        if row.get("kind") == "val" or first_step or time.monotonic() - self.last >= EMIT_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.worker.log_event(self.topic, {"rows": self.rows})
            self.rows = []
        self.last = time.monotonic()


class _SnapshotSender:
    """Rank 0: posts each training snapshot to the run's Dask queue, from a background thread.

    The training thread only hands over the snapshot (already copied to the CPU); serialising and
    sending happen here, so training never waits on the network. Only the newest unsent snapshot
    is kept: a slow link skips snapshots rather than queueing them. Snapshots go through the
    scheduler to the client, which owns the store: workers share no disk with it.
    """

    def __init__(self, queue_name: str) -> None:
        self.queue = distributed.Queue(queue_name, client=distributed.get_client())
        self._latest: TrainState | None = None
        self._closed = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._send_loop, name="petmodel-snapshots", daemon=True)
        self._thread.start()

    def __call__(self, state: TrainState) -> None:
        with self._wake:
            self._latest = state
            self._wake.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Send what is pending, then stop the thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout)

    def _send_loop(self) -> None:
        while True:
            with self._wake:
                while self._latest is None and not self._closed:
                    self._wake.wait()
                state, self._latest = self._latest, None
                if state is None:
                    return
            try:
                self.queue.put({"step": state.step, "elapsed": state.elapsed, "blob": state.to_bytes()}, timeout=30)
            except Exception:  # a lost snapshot costs only recovery time; never fail training for it
                log.warning("could not send a training snapshot", exc_info=True)


@dataclass(frozen=True)
class RankOutcome:
    """What one rank's task returns to the client when it finishes training.

    Only rank 0 carries ``state``, its final snapshot as bytes (weights, best weights, history): the
    ranks' weights are equal, the client needs them once, and they travel back as the task's result,
    so workers and client need no shared file system.
    """

    rank: int
    worker: str
    device: str
    steps: int
    samples: int  # this rank's
    train_seconds: float
    stopped_by: StopReason
    state: bytes | None = None


def _rank_main(*, spec: dict[str, Any], corpus: NameCorpus, topic: str, cancel_name: str, local_rank: int,
               cpu_slot: int = 0, host_workers: int = 1, snapshot_queue: str | None = None,
               resume: bytes | None = None, global_batch: int | None = None) -> RankOutcome:
    """The training function each rank runs inside ``dispatch_with_ddp`` (process group is up).

    ``resume``: the bytes of a snapshot to continue from (a re-formed or resumed run).
    """
    import torch

    from petmodel.train import train_model
    from petmodel.trainstate import TrainState

    worker = distributed.get_worker()
    rank, nthreads = torch.distributed.get_rank(), max(1, worker_nthreads(worker))
    torch.set_num_threads(nthreads)
    device = _rank_device(local_rank)
    emitter = _EventEmitter(topic)
    should_stop = _cancel_poller(cancel_name)
    pin = (pinned_to_own_cpus(cpu_slot, host_workers, nthreads)
           if device.type == "cpu" and torch.distributed.get_world_size() > 1 else contextlib.nullcontext())
    sender = _SnapshotSender(snapshot_queue) if rank == 0 and snapshot_queue else None

    def on_checkpoint(state: TrainState) -> None:
        emitter.flush()  # the client then has every step up to the snapshot: a re-formed run's curve has no gap
        state.spec = spec
        sender(state)
    try:
        with pin:
            run_spec = RunSpec.from_dict(spec)
            train_data, val_data = corpus.encode_splits()
            result = train_model(run_spec.model_config(corpus.alphabet.vocab_size), run_spec.train, train_data,
                                 val_data, device=device, on_metrics=emitter, should_stop=should_stop,
                                 resume=TrainState.from_bytes(resume) if resume else None,
                                 global_batch=global_batch,
                                 on_checkpoint=on_checkpoint if sender else None)
    finally:
        if sender is not None:
            sender.close()
    emitter.flush()
    result.state.spec = spec
    return RankOutcome(rank=rank, worker=worker.address, device=str(device), steps=result.steps,
                       samples=result.samples, train_seconds=result.train_seconds, stopped_by=result.stopped_by,
                       state=result.state.to_bytes() if rank == 0 else None)


def _rank_device(local_rank: int) -> Any:
    """This worker's GPU, or the CPU.

    A worker given ``CUDA_VISIBLE_DEVICES`` (dask-cuda rotates it per worker, so each lists its own
    GPU first) trains on the first device it lists; a worker that sees every GPU of its host takes
    the one of its local rank.
    """
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    device = torch.device("cuda", 0 if pinned else local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def _cancel_poller(cancel_name: str) -> Callable[[], bool]:
    """``should_stop`` for the loop, asked at most every :data:`CANCEL_POLL_S` (the loop polls it every few
    steps): whether the run's cancel Event is set, or this rank's task is no longer wanted (its driver is gone:
    see :func:`petmodel.compat.task_released`; any rank stopping stops them all at their next agreement)."""
    from petmodel.compat import task_released

    cancel = distributed.Event(cancel_name)
    worker = distributed.get_worker()
    last_poll = [0.0]

    def should_stop() -> bool:
        now = time.monotonic()
        if now - last_poll[0] < CANCEL_POLL_S:
            return False
        last_poll[0] = now
        if task_released(worker):
            log.warning("rank task released by the scheduler (its client is gone): stopping training")
            return True
        return cancel.is_set()

    return should_stop


def rank_entry(*, shared: dict[str, Any], pg_timeout_s: float, **kwargs: Any) -> RankOutcome:
    """Per-worker task: unpack the scattered payload (names are sent once, not once per rank),
    bound the process group's timeout, then hand over to dask-pytorch-ddp.

    Every argument is a keyword, none named like one of ``client.submit``'s own (``key``,
    ``workers``, ...), which ``submit`` would swallow.
    """
    from dask_pytorch_ddp.dispatch import dispatch_with_ddp

    bound_process_group_timeout(pg_timeout_s)
    return dispatch_with_ddp(pytorch_function=_rank_main, **kwargs, **shared)
