"""The scheduler's side of worker reservations (the client's side is :mod:`petmodel.cluster.reservations`).

The scheduler runs these functions on its event loop, one at a time, so each is atomic. They import
only the standard library and travel by value (:func:`ship_by_value`), so a scheduler without
``petmodel`` can run them. A holder or a waiter whose client is no longer connected to the scheduler
is dropped: a dead client's lease ends with it.
"""

from __future__ import annotations

import sys
from typing import Any


def ship_by_value() -> None:
    """Make Dask send this module's functions by value (cloudpickle), not as an import by name."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_RESERVATIONS = "_petmodel_reservations"
QUEUE_STALE_S = 30.0  # a waiter that has not asked again for this long has given up


def _reservations(scheduler: Any) -> dict[str, Any]:
    import time

    state = getattr(scheduler, _RESERVATIONS, None)
    if state is None:
        state = {"held": {}, "queue": []}
        setattr(scheduler, _RESERVATIONS, state)
    clients, now = set(scheduler.clients), time.time()
    state["held"] = {w: h for w, h in state["held"].items() if h["owner"] in clients and w in scheduler.workers}
    state["queue"] = [q for q in state["queue"] if q["owner"] in clients and now - q["seen"] < QUEUE_STALE_S]
    return state


def sched_reserve(key: str, owner: str, candidates: list[str], n: int, queue: bool,
                  dask_scheduler: Any = None) -> dict[str, Any]:
    """Give ``key`` the first ``n`` free ``candidates``, or its place in the queue (first come, first served)."""
    import time

    state = _reservations(dask_scheduler)
    entry = next((q for q in state["queue"] if q["key"] == key), None)
    ahead = state["queue"].index(entry) if entry is not None else len(state["queue"])  # no one jumps the queue
    free = [w for w in candidates if w not in state["held"]]
    busy = [w for w in candidates if w in state["held"]]
    if ahead == 0 and len(free) >= n:
        for w in free[:n]:
            state["held"][w] = {"owner": owner, "key": key, "since": time.time()}
        if entry is not None:
            state["queue"].remove(entry)
        return {"granted": free[:n], "busy": busy, "position": 0}
    if not queue:
        return {"granted": None, "busy": busy, "position": None, "waiting": len(state["queue"])}
    if entry is None:
        entry = {"key": key, "owner": owner, "n": n, "since": time.time()}
        state["queue"].append(entry)
    entry["seen"] = time.time()
    return {"granted": None, "busy": busy, "position": state["queue"].index(entry) + 1}


def sched_release(key: str, dask_scheduler: Any = None) -> int:
    """Free the workers ``key`` holds and take it out of the queue; how many workers it held."""
    state = _reservations(dask_scheduler)
    mine = [w for w, h in state["held"].items() if h["key"] == key]
    for w in mine:
        del state["held"][w]
    state["queue"] = [q for q in state["queue"] if q["key"] != key]
    return len(mine)


def sched_reservations(dask_scheduler: Any = None) -> dict[str, Any]:
    """Who holds which worker, and who waits: ``{"held": {worker: key}, "queue": [(key, n), ...]}``."""
    state = _reservations(dask_scheduler)
    return {"held": {w: h["key"] for w, h in state["held"].items()},
            "queue": [(q["key"], q["n"]) for q in state["queue"]]}


RELEASE_PREFIX = "petmodel-release-"  # the key of workers claimed to be released (petmodel.cluster.scaling)
GUARD_NAME = "petmodel-reservations-guard"


def sched_install_guard(dask_scheduler: Any = None) -> bool:
    """Keep every worker held for a run out of the scheduler's downscaling; False when already there.

    Dask's ``adapt()``, a Dask Gateway's ``scale(n)`` and anything else that asks
    ``Scheduler.workers_to_close`` know nothing of DDP reservations and could retire a worker under a
    running run. A scheduler plugin's public ``valid_workers_downscaling`` hook filters the candidates:
    workers claimed for release (:data:`RELEASE_PREFIX`) when there are any, so a scale-down takes
    exactly those, else the workers no run holds. The class is made here, on the scheduler, so
    nothing but this function travels (by value).
    """
    from distributed.diagnostics.plugin import SchedulerPlugin

    if GUARD_NAME in dask_scheduler.plugins:
        return False
    state_of, prefix = _reservations, RELEASE_PREFIX

    class ReservationGuard(SchedulerPlugin):
        name = GUARD_NAME

        def valid_workers_downscaling(self, scheduler: Any, workers: list[Any]) -> list[Any]:
            held = state_of(scheduler)["held"]
            claimed = {w for w, h in held.items() if str(h["key"]).startswith(prefix)}
            if claimed:
                return [ws for ws in workers if ws.address in claimed]
            return [ws for ws in workers if ws.address not in held]

    dask_scheduler.add_plugin(ReservationGuard(), name=GUARD_NAME)
    return True
