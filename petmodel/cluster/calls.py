"""Bounded calls to the scheduler and to each worker separately.

``Client.run`` asks all its workers in one scheduler broadcast, so one frozen worker (SIGSTOP,
a hung driver) holds the whole call, with no timeout, and the answer cannot say which worker it
was. :func:`run_each` asks every worker on its own, all at once, each bounded by ``timeout``, and
returns what each said (or :class:`NoAnswer`), so callers can name the worker that is stuck.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from distributed import Client

from petmodel.compat import run_on_scheduler_within, sync_within
from petmodel.errors import PetmodelError, SchedulerSilent, WorkerCallFailed, WorkerSilent, first_line

PING_TIMEOUT_S = 5.0  # a worker that does not run a no-op within this is taken as frozen
CALL_TIMEOUT_S = 10.0  # bound on each call to the scheduler or a worker while starting or reserving a run


@dataclass(frozen=True)
class NoAnswer:
    """What :func:`run_each` reports for a worker that did not answer in time or failed."""

    address: str
    reason: str  # "timeout", or the error's one-line text


def run_each(client: Client, fn: Callable[..., Any], addresses: Iterable[str], *, timeout: float,
             **kwargs: Any) -> dict[str, Any]:
    """``fn(**kwargs)`` on each worker in ``addresses``; each answer, or a :class:`NoAnswer`.

    Never waits much more than ``timeout`` in all, whatever the workers do.
    """
    addresses = list(addresses)
    if not addresses:
        return {}

    async def one(address: str) -> Any:
        try:
            out = await asyncio.wait_for(
                client.run(fn, workers=[address], on_error="return", asynchronous=True, **kwargs), timeout)
        except asyncio.TimeoutError:
            return NoAnswer(address, "timeout")
        except Exception as err:  # noqa: BLE001 - a worker gone mid-call is an answer too
            return NoAnswer(address, first_line(err, typed=True, limit=200))
        if address not in out:
            return NoAnswer(address, "left the cluster")
        value = out[address]
        if isinstance(value, BaseException):
            return NoAnswer(address, first_line(value, typed=True, limit=200))
        return value

    async def every() -> list[Any]:
        return await asyncio.gather(*(one(a) for a in addresses))

    try:
        answers = sync_within(client, every, timeout=timeout + 5)
    except Exception as err:  # noqa: BLE001 - the scheduler itself stopped answering
        raise PetmodelError(f"The Dask scheduler did not relay calls to its workers within {timeout:g} s; "
                            "check that it is still running.") from err
    return dict(zip(addresses, answers))


def on_scheduler(client: Client, fn: Callable[..., Any], *, timeout: float, **kwargs: Any) -> Any:
    """``fn(**kwargs)`` on the scheduler, bounded by ``timeout``; SchedulerSilent if it does not answer."""
    try:
        return run_on_scheduler_within(client, fn, timeout=timeout, **kwargs)
    except (OSError, asyncio.TimeoutError) as err:
        raise SchedulerSilent(f"The Dask scheduler did not answer within {timeout:g} s; check that it is "
                              "still running.") from err


def silent_workers(answers: dict[str, Any]) -> list[str]:
    """Workers among ``answers`` that timed out (frozen or overloaded)."""
    return [a for a, v in answers.items() if isinstance(v, NoAnswer) and v.reason == "timeout"]


def require_answers(answers: dict[str, Any], timeout: float, doing: str) -> None:
    """Raise one sentence naming the first worker that did not answer ``doing``.

    :class:`~petmodel.errors.WorkerSilent` for a timeout, :class:`~petmodel.errors.WorkerCallFailed`
    otherwise: callers that must not go on with such a worker catch the type, never the wording.
    """
    for address, value in answers.items():
        if isinstance(value, NoAnswer):
            if value.reason == "timeout":
                raise WorkerSilent(f"Worker {address} did not answer within {timeout:g} s while {doing} "
                                   "(frozen or overloaded); restart or remove it and try again.")
            raise WorkerCallFailed(f"Worker {address} failed while {doing} ({value.reason}); check its log.")


def ping() -> bool:
    """Runs on a worker: answers at once unless the worker is frozen."""
    return True


def first_silent(client: Client, addresses: list[str], *, timeout: float) -> str | None:
    """The first of ``addresses`` that does not run a no-op within ``timeout`` (frozen), or None."""
    try:
        answers = run_each(client, ping, addresses, timeout=timeout)
    except PetmodelError:  # the scheduler itself did not relay: no worker to blame
        return None
    return next(iter(silent_workers(answers)), None)
