"""One run per worker across every client of a cluster: reservations kept on the scheduler.

:mod:`petmodel.cluster.registry` only knows the runs of this process; two app sessions, or the app
and the CLI, would otherwise put two runs on one worker. Reservations live in the scheduler's
memory and are changed only by small functions the scheduler runs on its own event loop
(:func:`~petmodel.cluster.reservation_state.sched_reserve` and friends), so two launches cannot both take a
worker. A reservation belongs to the client that made it: when that client disconnects (its
process died), the scheduler drops it, so nothing leaks. A launch that finds too few free workers
either waits in a first-come-first-served queue (its position reported as it moves, cancellable)
or is refused naming the busy workers.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from distributed import Client

from petmodel.cluster.calls import CALL_TIMEOUT_S, PING_TIMEOUT_S, on_scheduler, ping, run_each, silent_workers
from petmodel.cluster.reservation_state import (RELEASE_PREFIX, sched_install_guard, sched_release,
                                                sched_reservations, sched_reserve, ship_by_value)
from petmodel.compat import client_running
from petmodel.errors import LaunchCancelled, PetmodelError

POLL_S = 0.5  # how often a queued launch asks again (and tells the scheduler it still waits)


@dataclass(frozen=True)
class Reservation:
    """Workers held on the scheduler for one launch, under ``key``, until :func:`release`."""

    key: str
    workers: list[str]


def reserve(client: Client, candidates: Sequence[str], n: int, *, wait: bool = False,
            on_queue: Callable[[int, list[str]], None] | None = None, cancel: threading.Event | None = None,
            max_wait_s: float | None = None, prefix: str = "petmodel-") -> Reservation:
    """Hold ``n`` of ``candidates`` (first free ones, in their order) for one run.

    ``wait``: queue until they are free, calling ``on_queue(position, busy workers)`` whenever the
    position changes; ``cancel`` (set from another thread) ends the wait with LaunchCancelled,
    ``max_wait_s`` with PetmodelError. Without ``wait``, PetmodelError names the busy workers at once.
    """
    ship_by_value()
    key = f"{prefix}{uuid.uuid4().hex[:12]}"  # prefix: RELEASE_PREFIX claims workers to release, not to train
    started, last_position = time.monotonic(), None
    try:
        while True:
            answer = on_scheduler(client, sched_reserve, timeout=CALL_TIMEOUT_S, key=key, owner=client.id,
                                  candidates=list(candidates), n=n, queue=wait)
            if answer["granted"]:
                return Reservation(key, list(answer["granted"]))
            busy = list(answer["busy"])
            if not wait:
                why = (f"busy with other runs: {', '.join(busy)}" if busy else
                       f"{answer['waiting']} other launch(es) wait for them first")
                raise PetmodelError(f"Asked for {n} workers but only {len(candidates) - len(busy)} of the cluster's "
                                    f"{len(candidates)} are free ({why}); wait for a run to finish or ask for fewer.")
            if answer["position"] != last_position:
                last_position = answer["position"]
                if on_queue is not None:
                    on_queue(int(answer["position"]), busy)
            if cancel is not None and cancel.wait(POLL_S):
                raise LaunchCancelled("The launch was cancelled while it waited for free workers.")
            if cancel is None:
                time.sleep(POLL_S)
            if max_wait_s is not None and time.monotonic() - started > max_wait_s:
                raise PetmodelError(f"No {n} workers became free within {max_wait_s:g} s (busy: {', '.join(busy)}); "
                                    "try again later.")
    except BaseException:
        release(client, key)  # leave the queue (or drop a grant the caller never saw)
        raise


def release(client: Client, key: str | None) -> None:
    """Give the workers of ``key`` back (and leave the queue); never raises, it is for cleanup."""
    if not key or not client_running(client):
        return  # a closed client's reservations end with its connection
    try:
        ship_by_value()
        on_scheduler(client, sched_release, timeout=CALL_TIMEOUT_S, key=key)
    except Exception:  # noqa: BLE001 - the scheduler drops them when this client disconnects anyway
        pass


def snapshot(client: Client) -> dict[str, Any]:
    """``{"held": {worker: key}, "queue": [(key, n), ...]}`` across every client of the cluster."""
    ship_by_value()
    return on_scheduler(client, sched_reservations, timeout=CALL_TIMEOUT_S)


def hold_workers(client: Client, n: int, described: Sequence[Any], addresses: Sequence[str] | None = None, *,
                 wait: bool = False, on_queue: Callable[[int, list[str]], None] | None = None,
                 cancel: threading.Event | None = None) -> Reservation:
    """Reserve ``n`` workers of ``described`` (``WorkerInfo``s in cluster order), or exactly ``addresses``.

    The granted workers come back in rank order: grouped by host (local ranks contiguous), cluster
    order within a host. Workers that did not answer the last description are never candidates.
    """
    if addresses:
        candidates = list(addresses)
    else:
        if n > len(described):
            raise PetmodelError(f"Asked for {n} workers but the cluster has {len(described)}; start more workers "
                                "or ask for fewer.")
        candidates = [w.address for w in described if w.responsive]
        if n > len(candidates):
            silent = [w.address for w in described if not w.responsive]
            raise PetmodelError(f"Asked for {n} workers but {len(silent)} of the cluster's {len(described)} do not "
                                f"answer ({', '.join(silent)}); restart them or ask for fewer.")
    held = reserve(client, candidates, len(candidates) if addresses else n, wait=wait, on_queue=on_queue,
                   cancel=cancel)
    if addresses:
        return held
    index = {w.address: (w.host, i) for i, w in enumerate(described)}
    return Reservation(held.key, sorted(held.workers, key=lambda a: index.get(a, ("", 0))))


def reserve_free(client: Client, want: int, *, exclude: Sequence[str], cancel: threading.Event | None = None,
                 wait_s: float = 0.0) -> tuple[str | None, list[Any]]:
    """Reserve up to ``want`` free, answering workers not in ``exclude``: (reservation key, ``WorkerInfo``s).

    For a run that lost workers and re-forms: it takes what is free now, or, with ``wait_s``, keeps
    looking (a replacement joining the cluster) that long. ``(None, [])`` when none could be had.
    """
    from petmodel.cluster.workers import describe_workers

    deadline = time.monotonic() + wait_s
    while want > 0:
        try:  # only the candidates are pinged: a frozen worker of the run must not cost its timeout again
            others = [w for w in describe_workers(client, timeout=CALL_TIMEOUT_S, probe_gpus=False)
                      if w.address not in exclude]
            silent = silent_workers(run_each(client, ping, [w.address for w in others], timeout=PING_TIMEOUT_S))
            free = [w for w in others if w.address not in silent]
        except Exception:  # noqa: BLE001 - a slow scheduler: ask again until the deadline
            free = []
        for n in range(min(want, len(free)), 0, -1):
            try:
                held = reserve(client, [w.address for w in free], n)
            except PetmodelError:
                continue
            return held.key, [w for w in free if w.address in held.workers]
        if time.monotonic() >= deadline or (cancel is not None and cancel.wait(1.0)):
            break
        if cancel is None:
            time.sleep(1.0)
    return None, []


def install_guard(client: Client) -> bool:
    """Make the scheduler keep reserved workers out of every downscaling (see ``sched_install_guard``)."""
    ship_by_value()
    return bool(on_scheduler(client, sched_install_guard, timeout=CALL_TIMEOUT_S))


def claim_for_release(client: Client, workers: Sequence[str]) -> Reservation:
    """Hold ``workers`` (all of them, free now) so no launch takes them while they are released.

    PetmodelError when one was reserved in the meantime. While the claim lasts, the guard offers
    only these workers to the scheduler's downscaling; :func:`release` it once they are gone.
    """
    return reserve(client, list(workers), len(workers), prefix=RELEASE_PREFIX)
