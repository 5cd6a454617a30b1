"""Every check a worker must pass before a run trains on it, in one list for a launch and a re-form alike.

A worker that joined the cluster after connect was never compared with this client: it may import
other ``petmodel`` code, run another torch, or be unable to train in the run's precision. A launch
refuses such a worker; a run re-forming after a lost worker must refuse it too, or it would take
the very worker a launch turns away. Both go through :data:`CHECKS`, so the two cannot drift
apart: :func:`require_all` (a launch) raises the first check's own one-sentence error, and
:func:`refusals` (a re-form) says which workers fail which check, so the others can still be used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from distributed import Client

from petmodel.cluster import versions
from petmodel.cluster.shipping import verify_shipped
from petmodel.cluster.workers import check_precision_on
from petmodel.errors import PetmodelError

Check = Callable[[Client, list[str], str, float], None]  # (client, addresses, precision, timeout); raises to refuse


def _code(client: Client, addresses: list[str], precision: str, timeout: float) -> None:
    verify_shipped(client, addresses, timeout=timeout)  # late joiners run the code shipped at connect


def _versions(client: Client, addresses: list[str], precision: str, timeout: float) -> None:
    versions.check_new_workers(client, addresses, timeout=timeout)  # and the packages this client runs


def _precision(client: Client, addresses: list[str], precision: str, timeout: float) -> None:
    check_precision_on(client, precision, addresses, timeout=timeout)


# In the order a launch has always applied them: the cheapest question first, each on the workers that passed.
CHECKS: tuple[tuple[str, Check], ...] = (("code", _code), ("versions", _versions), ("precision", _precision))


@dataclass(frozen=True)
class Refusal:
    """A worker a run must not train on: the check it failed and that check's own one-sentence error."""

    worker: str
    check: str  # a name of CHECKS: "code", "versions" or "precision"
    error: PetmodelError

    @property
    def reason(self) -> str:
        """The error as a clause to quote inside another sentence (no capital, no full stop)."""
        text = str(self.error).strip().rstrip(".")
        return text[:1].lower() + text[1:]


def require_all(client: Client, addresses: Sequence[str], *, precision: str, timeout: float) -> None:
    """Raise the first failing check's one-sentence error (naming the worker), as a launch refuses."""
    for _, check in CHECKS:
        check(client, list(addresses), precision, timeout)


def refusals(client: Client, addresses: Sequence[str], *, precision: str, timeout: float) -> list[Refusal]:
    """Each worker of ``addresses`` that fails a check, with the first check it fails; ``[]`` when all pass.

    Every check asks all workers at once; only when it refuses one is it asked of each worker alone, to
    learn which (a check names just the first worker it refuses).
    """
    left, out = list(addresses), []
    for name, check in CHECKS:
        if not left:
            break
        for address, err in _failing(check, client, left, precision, timeout).items():
            out.append(Refusal(address, name, err))
            left.remove(address)
    return out


def _failing(check: Check, client: Client, addresses: list[str], precision: str,
             timeout: float) -> dict[str, PetmodelError]:
    try:
        check(client, addresses, precision, timeout)
        return {}
    except PetmodelError as err:
        if len(addresses) == 1:
            return {addresses[0]: err}
    failed: dict[str, PetmodelError] = {}
    for address in addresses:
        try:
            check(client, [address], precision, timeout)
        except PetmodelError as err:
            failed[address] = err
    return failed
