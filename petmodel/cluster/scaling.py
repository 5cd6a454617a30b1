"""Launches that ask a scalable cluster for the workers they need, and give back the ones nobody holds.

A cluster object that can ``scale(n)`` (the embedded ``LocalCluster``, a Dask Gateway cluster, any
``distributed.deploy.Cluster``: dask-jobqueue, dask-kubernetes, Coiled) gets a :class:`ClusterScaler`
(:func:`attach`). A launch that needs N free workers asks it first (:meth:`ClusterScaler.providing`):
short of workers, it asks the cluster for more, up to :attr:`ScalingConfig.max_workers
<petmodel.config.ScalingConfig>`, says so ("Asked the cluster for 2 more workers…") and waits for them
to join; then the launch reserves them as usual (:mod:`petmodel.cluster.reservations`). A thread of
the scaler gives back workers that no run has held for the grace period, never below the size the
user chose (:attr:`ClusterScaler.floor`).

Why not Dask's ``adapt()``: it sizes a cluster by its task queue and knows nothing of DDP
reservations, so it could retire a worker under a running run (whose rank is one long task). Here
only unreserved workers are released, by name: they are first claimed on the scheduler, so no
launch can take them meanwhile, and the scheduler's downscaling is guarded
(:func:`~petmodel.cluster.reservation_state.sched_install_guard`) so that a cluster that picks its own
victims (a gateway's ``scale(n)``, ``adapt()``) picks exactly those.

The decisions are pure functions (:func:`plan_growth`, :func:`plan_release`), tested without a
cluster; :class:`ClusterScaler` only carries them out.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from distributed import Client

from petmodel.cluster import reservations
from petmodel.cluster.calls import CALL_TIMEOUT_S
from petmodel.cluster.workers import WorkerInfo, describe_workers
from petmodel.compat import client_running
from petmodel.config import ScalingConfig, counted
from petmodel.errors import LaunchCancelled, PetmodelError

log = logging.getLogger(__name__)

TICK_S = 1.0  # how often the scaler looks for workers to give back
POLL_S = 0.5  # how often a launch that asked for workers looks whether they joined
RELEASE_WAIT_S = 20.0  # how long released workers may take to leave before their claim is dropped


# --------------------------------------------------------------------------- the policy (pure)
@dataclass(frozen=True)
class Growth:
    """What a launch short of workers asks of the cluster: ``ask`` more, for ``target`` in all."""

    short: int  # free workers missing for the launch, counting those already asked for
    ask: int  # workers to ask the cluster for now (0: enough free, or asked already, or at the maximum)
    target: int  # the cluster's size once they are there
    refusal: str | None = None  # one sentence when no growth can ever give the launch its workers


def plan_growth(need: int, *, total: int, free: int, pending: int, max_workers: int) -> Growth:
    """How to get ``need`` free workers from a cluster of ``total`` (``free`` unheld, ``pending`` asked for).

    The cluster grows by what is missing, up to ``max_workers`` in all; what still misses then is
    waited for in the reservation queue (busy workers free up). A launch larger than the maximum and
    than the cluster is refused, since nothing would ever let it start.
    """
    if need > max(max_workers, total):
        return Growth(short=need, ask=0, target=total, refusal=(
            f"The run needs {need} workers but this cluster may grow to {max_workers} at most; ask for fewer "
            "workers or raise the scaling maximum."))
    short = max(0, need - free - pending)
    room = max(0, max_workers - total - pending)
    ask = min(short, room)
    return Growth(short=short, ask=ask, target=total + pending + ask)


def plan_release(workers: Sequence[str], held: set[str] | frozenset[str], idle_since: Mapping[str, float], *,
                 now: float, grace_s: float, keep: int) -> list[str]:
    """The workers to give back: unheld ones idle ``grace_s`` or longer, leaving at least ``keep``.

    ``workers`` in cluster order; the latest are given back first (they are the extras a launch
    asked for, while the first ones are those the cluster started with).
    """
    room = len(workers) - max(0, keep)
    if room <= 0:
        return []
    idle = [w for w in workers if w not in held and now - idle_since.get(w, now) >= grace_s]
    return idle[-room:] if idle else []


def keep_count(floor: int, held: int, waiting: int) -> int:
    """Workers the cluster keeps: the user's size, or what runs hold plus what launches wait for."""
    return max(floor, held + waiting)


# --------------------------------------------------------------------------- how a cluster scales
def _within(timeout: float, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a daemon thread, bounded: a cluster manager's API can hang on a network."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - handed back to the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, name="petmodel-scale-call", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise PetmodelError(f"The cluster did not answer within {timeout:g} s while {what}; check its manager.")
    if "error" in box:
        err = box["error"]
        if isinstance(err, PetmodelError):
            raise err
        raise PetmodelError(f"The cluster refused while {what} ({type(err).__name__}: {err}).") from err
    return box.get("value")


class _ByTarget:
    """A cluster told only its size (``scale(n)``): a Dask Gateway cluster, or a ``Cluster`` without
    ``scale_down``. It picks whom to retire through the scheduler, which the guard limits to the claimed."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def size(self) -> int | None:
        return None  # not known without asking the scheduler

    def grow(self, target: int) -> None:
        _within(CALL_TIMEOUT_S * 3, f"asking for {target} workers", self.cluster.scale, target)

    def release(self, names: list[str], target: int) -> None:
        _within(CALL_TIMEOUT_S * 3, f"scaling down to {target} workers", self.cluster.scale, target)


class _ByName(_ByTarget):
    """A ``SpecCluster`` (``LocalCluster``, dask-jobqueue's): grown with ``scale(n)``, shrunk by worker name.

    ``worker_config``: the Dask settings the cluster's first workers started with (the embedded
    cluster's tuning); new nannies read Dask's configuration when they are created, so a scale-up
    holds those settings until its workers have started.
    """

    def __init__(self, cluster: Any, worker_config: Mapping[str, Any] | None = None) -> None:
        super().__init__(cluster)
        self.worker_config = dict(worker_config or {})

    def size(self) -> int | None:
        return len(self.cluster.worker_spec)

    def grow(self, target: int) -> None:
        import dask

        target = max(target, len(self.cluster.worker_spec))  # scale(n) below its spec would retire workers
        with dask.config.set(self.worker_config):
            self.cluster.scale(target)
            deadline = time.monotonic() + CALL_TIMEOUT_S * 3
            while len(self.cluster.workers) < target and time.monotonic() < deadline:
                time.sleep(0.05)  # the nannies are created (and read the settings) as they start

    def release(self, names: list[str], target: int) -> None:
        keys = {str(k): k for k in self.cluster.worker_spec}  # the scheduler reports names as text
        chosen = [keys.get(str(n), n) for n in names]
        _within(CALL_TIMEOUT_S * 3, f"retiring {len(chosen)} workers", self.cluster.sync,
                self.cluster.scale_down, chosen)


def can_scale(cluster: Any) -> bool:
    """Whether ``cluster`` is an object that can be asked for a number of workers."""
    return cluster is not None and callable(getattr(cluster, "scale", None)) and \
        getattr(cluster, "scheduler_address", None) is not None


def _manager(cluster: Any, worker_config: Mapping[str, Any] | None) -> _ByTarget:
    if hasattr(cluster, "worker_spec") and inspect.iscoroutinefunction(getattr(cluster, "scale_down", None)):
        return _ByName(cluster, worker_config)
    return _ByTarget(cluster)


# --------------------------------------------------------------------------- the scaler
class ClusterScaler:
    """Grows ``cluster`` for launches and gives back the workers no run holds; safe to share across threads.

    ``floor``: the size the user chose (default: the cluster's size now); workers above it that no
    run holds are given back after ``config.grace_s``. ``tick_s=None`` starts no background thread
    (tests call :meth:`tick`).
    """

    def __init__(self, client: Client, cluster: Any, config: ScalingConfig | None = None, *,
                 floor: int | None = None, worker_config: Mapping[str, Any] | None = None,
                 tick_s: float | None = TICK_S) -> None:
        self.client, self.cluster = client, cluster
        self.config = config or ScalingConfig.from_env()
        self._manager = _manager(cluster, worker_config)
        self._lock = threading.RLock()
        self._demand = 0  # workers launches in progress are about to reserve
        self._requested: int | None = None  # the size last asked of the cluster
        self._idle_since: dict[str, float] = {}  # since when no run holds each worker
        self._first_seen: dict[str, float] = {}  # when each worker was first seen (join order)
        self.last_action: str | None = None  # the latest sentence, for the Cluster page
        now_there = self._workers()
        for i, w in enumerate(now_there):  # the cluster's own workers come first in the join order
            self._first_seen[w.address] = -float(len(now_there) - i)
        self.floor = len(now_there) if floor is None else max(0, int(floor))
        reservations.install_guard(client)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if tick_s:
            self._thread = threading.Thread(target=self._loop, args=(tick_s,), name="petmodel-scaler", daemon=True)
            self._thread.start()

    @property
    def max_workers(self) -> int:
        return self.config.max_workers

    def configure(self, *, max_workers: int | None = None, grace_s: float | None = None) -> None:
        """Change the maximum a launch may grow the cluster to, or the grace period (checked by ScalingConfig)."""
        with self._lock:
            self.config = ScalingConfig(max_workers=self.config.max_workers if max_workers is None else max_workers,
                                        grace_s=self.config.grace_s if grace_s is None else grace_s,
                                        join_timeout_s=self.config.join_timeout_s)

    def _workers(self, timeout: float = CALL_TIMEOUT_S) -> list[WorkerInfo]:
        return describe_workers(self.client, timeout=timeout, probe_gpus=False)

    def _say(self, text: str, on_scale: Callable[[str], None] | None = None) -> None:
        self.last_action = text
        log.info(text)
        if on_scale is not None:
            on_scale(text)

    def _grow(self, target: int) -> None:
        self._requested = target
        self._manager.grow(target)

    # ---- launches -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def providing(self, need: int, described: list[WorkerInfo], *, on_scale: Callable[[str], None] | None = None,
                  cancel: threading.Event | None = None) -> Iterator[list[WorkerInfo]]:
        """Make ``need`` free workers likely to be there, then yield the cluster's workers described anew.

        Asks the cluster for what is missing (up to the maximum) and waits until they joined, saying
        so to ``on_scale``; while the caller reserves them (inside the ``with``), they count as wanted
        and are not given back. PetmodelError when they do not join in time, LaunchCancelled on ``cancel``.
        """
        with self._lock:
            held = set(reservations.snapshot(self.client)["held"])
            free = sum(1 for w in described if w.responsive and w.address not in held)
            total = len(described)
            pending = max(0, (self._requested or total) - total)
            growth = plan_growth(need, total=total, free=free, pending=pending, max_workers=self.max_workers)
            if growth.refusal:
                raise PetmodelError(growth.refusal)
            self._demand += need
            try:
                if growth.ask:  # under the lock: a second launch counts these as asked for, not asks again
                    self._say(f"Asked the cluster for {counted(growth.ask, 'more worker')} "
                              f"({total} now, at most {self.max_workers}).", on_scale)
                    self._grow(growth.target)
            except BaseException:
                self._demand = max(0, self._demand - need)
                raise
        try:
            if growth.target > total:
                described = self._await_growth(growth, total, on_scale, cancel)
            yield described
        finally:
            with self._lock:
                self._demand = max(0, self._demand - need)

    def _await_growth(self, growth: Growth, total: int, on_scale: Callable[[str], None] | None,
                      cancel: threading.Event | None) -> list[WorkerInfo]:
        """Wait until the cluster has ``growth.target`` workers; them, described with their GPUs."""
        more = growth.target - total
        started = time.monotonic()
        deadline = started + self.config.join_timeout_s
        seen = -1
        while True:
            described = self._workers()
            joined = len(described) - total
            if len(described) >= growth.target:
                # With their GPUs, for the launch. A fresh worker imports torch for the probe (many seconds on a
                # busy host), which is part of joining: it may take the rest of the join time.
                return describe_workers(self.client, timeout=max(CALL_TIMEOUT_S, deadline - time.monotonic()))
            if joined != seen:
                seen = joined
                self._say(f"Asked the cluster for {counted(more, 'more worker')}: {max(0, joined)} "
                          f"joined so far.", on_scale)
            if time.monotonic() > deadline:
                raise PetmodelError(f"Asked the cluster for {more} more workers but only {max(0, joined)} joined "
                                    f"within {self.config.join_timeout_s:g} s; check the cluster's quota or logs, "
                                    "or ask for fewer workers.")
            if cancel is not None and cancel.wait(POLL_S):
                raise LaunchCancelled("The launch was cancelled while it waited for new workers.")
            if cancel is None:
                time.sleep(POLL_S)

    # ---- the user's size ------------------------------------------------------------------------
    def scale_to(self, n: int, *, wait: bool = False, on_scale: Callable[[str], None] | None = None) -> str:
        """Make ``n`` the cluster's size (and its floor): grow now, or give back unheld workers now.

        Workers that runs hold are never taken: the cluster then shrinks as those runs end. ``wait``:
        return once the workers asked for have joined (PetmodelError after ``join_timeout_s``), telling
        ``on_scale`` how many have. Returns the sentence it also keeps in :attr:`last_action`.
        """
        n = max(0, int(n))
        text = self._scale_now(n)
        if wait:
            total = len(self._workers())
            if total < n:
                self._await_growth(Growth(short=n - total, ask=0, target=n), total, on_scale, None)
        return text

    def _scale_now(self, n: int) -> str:
        with self._lock:
            self.floor = n
            described = self._workers()
            total = len(described)
            for i, w in enumerate(described):  # a worker never ticked over counts as old
                self._first_seen.setdefault(w.address, -float(len(described) - i))
            if n > total:
                self._grow(n)
                text = f"Asked the cluster for {counted(n - total, 'more worker')} ({n} in all)."
            elif n < total:
                held = set(reservations.snapshot(self.client)["held"])
                free = sorted((w.address for w in described if w.address not in held),
                              key=lambda a: self._first_seen[a])
                victims = free[-(total - n):]
                released = self._release(victims, described)
                kept = total - n - len(released)
                text = (f"Released {counted(len(released), 'worker')}"
                        + (f"; {kept} more go when the runs holding them end." if kept else "."))
            else:
                text = f"The cluster already has {counted(n, 'worker')}."
            self._say(text)
            return text

    # ---- giving workers back --------------------------------------------------------------------
    def tick(self, now: float | None = None) -> list[str]:
        """Give back the workers no run has held for the grace period; the addresses released."""
        with self._lock:
            if not client_running(self.client):
                return []
            now = time.monotonic() if now is None else now
            described = self._workers()
            snap = reservations.snapshot(self.client)
            held = set(snap["held"])
            for w in described:
                self._first_seen.setdefault(w.address, now)
            # In the order they joined: the latest (the extras launches asked for) are given back first.
            addresses = sorted((w.address for w in described), key=lambda a: self._first_seen[a])
            for address in addresses:
                if address in held:
                    self._idle_since.pop(address, None)
                else:
                    self._idle_since.setdefault(address, now)
            for gone in set(self._idle_since) - set(addresses):
                del self._idle_since[gone]
            for gone in set(self._first_seen) - set(addresses):
                del self._first_seen[gone]
            waiting = max(self._demand, sum(int(n) for _, n in snap["queue"]))
            keep = keep_count(self.floor, len(held & set(addresses)), waiting)
            victims = plan_release(addresses, held, self._idle_since, now=now, grace_s=self.config.grace_s,
                                   keep=keep)
            if not victims:
                return []
            released = self._release(victims, described)
            if released:
                self._say(f"Released {counted(len(released), 'idle worker')} (no run held "
                          f"{'them' if len(released) != 1 else 'it'} for {self.config.grace_s:g} s).")
            return released

    def _release(self, victims: list[str], described: list[WorkerInfo]) -> list[str]:
        """Claim ``victims`` on the scheduler, retire exactly them, drop the claim; those released."""
        if not victims:
            return []
        try:
            claim = reservations.claim_for_release(self.client, victims)
        except PetmodelError:
            return []  # a launch took one in the meantime: look again next tick
        try:
            names = {w.address: w.name for w in described}
            target = max(0, len(described) - len(victims))
            self._requested = target
            self._manager.release([names[a] for a in victims if a in names], target)
            deadline = time.monotonic() + RELEASE_WAIT_S
            left = set(victims)
            while left and time.monotonic() < deadline:  # keep the claim until they are gone (the guard offers
                time.sleep(0.2)                           # only them to the cluster's own choice)
                left = set(victims) & {w.address for w in self._workers()}
        finally:
            reservations.release(self.client, claim.key)
        for address in victims:  # one that stayed (it holds data nobody else has) is tried again after the grace
            self._idle_since.pop(address, None)
        return [a for a in victims if a not in left]

    def _loop(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            if not client_running(self.client):
                return
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a slow scheduler: try again next tick
                log.debug("Scaler tick failed", exc_info=True)

    def close(self) -> None:
        """Stop giving workers back (the cluster keeps its size); safe to call twice."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def describe(self) -> dict[str, Any]:
        """What the Cluster page shows: the size chosen, the maximum, the grace period, the last action."""
        return {"floor": self.floor, "max_workers": self.max_workers, "grace_s": self.config.grace_s,
                "last_action": self.last_action}


# --------------------------------------------------------------------------- which client has one
_ATTR = "petmodel_scaler"


def attach(client: Client, scaler: ClusterScaler) -> ClusterScaler:
    """Make launches on ``client`` ask ``scaler`` for workers (replacing and closing any earlier one)."""
    old = scaler_of(client)
    if old is not None and old is not scaler:
        old.close()
    setattr(client, _ATTR, scaler)
    return scaler


def scaler_of(client: Client | None) -> ClusterScaler | None:
    """The scaler launches on ``client`` ask, or None for a cluster that cannot scale."""
    return getattr(client, _ATTR, None) if client is not None else None


def detach(client: Client | None) -> None:
    """Stop ``client``'s scaler, if any (before the client closes); never raises."""
    scaler = scaler_of(client)
    if scaler is not None:
        with contextlib.suppress(Exception):
            scaler.close()
        with contextlib.suppress(AttributeError):
            delattr(client, _ATTR)
