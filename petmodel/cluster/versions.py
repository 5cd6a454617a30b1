"""Compare Python and the packages a run needs on the client, the scheduler and every worker.

A run pickles functions and tensors between these processes and runs a torch process group
across the workers, so some differences break it (another Python minor version, another dask or
distributed release, another torch minor version, no torch or dask-pytorch-ddp on a worker) and
are refused at connect time with one sentence; the full table is for the Cluster page.
"""

from __future__ import annotations

from typing import Any

from distributed import Client

from petmodel.cluster.client import PetmodelClient
from petmodel.cluster.calls import on_scheduler, require_answers, run_each
from petmodel.cluster.probes import VERSIONED, probe_versions, ship_by_value
from petmodel.compat import scheduler_address
from petmodel.errors import PetmodelError

COLUMNS = ("python", *VERSIONED)
# How much of each version must match the client's: 2 = major.minor, None = all of it.
_MATCH: dict[str, int | None] = {"python": 2, "torch": 2, "dask": None, "distributed": None,
                                 "dask-pytorch-ddp": None}
_SCHEDULER_NEEDS = ("python", "dask", "distributed")  # the scheduler never runs torch


def _cut(version: str | None, parts: int | None) -> str | None:
    if version is None or parts is None:
        return version
    return ".".join(version.split("+")[0].split(".")[:parts])


def collect(client: Client, workers: list[str], *, timeout: float) -> list[dict[str, Any]]:
    """One row per process (role, address, host and each version), the client's first.

    Raises PetmodelError naming a worker that does not answer within ``timeout``.
    """
    ship_by_value()
    rows = [{"role": "client", "address": "", **probe_versions()}]
    rows.append({"role": "scheduler", "address": scheduler_address(client),
                 **on_scheduler(client, probe_versions, timeout=timeout)})
    return rows + _worker_rows(client, workers, timeout=timeout)


def _worker_rows(client: Client, workers: list[str], *, timeout: float) -> list[dict[str, Any]]:
    answers = run_each(client, probe_versions, workers, timeout=timeout)
    require_answers(answers, timeout, "reporting its package versions")
    return [{"role": "worker", "address": a, **answers[a]} for a in workers]


def check(rows: list[dict[str, Any]]) -> None:
    """Raise one sentence for the first process whose versions would break a run."""
    mine = rows[0]
    for row in rows[1:]:
        needed = _SCHEDULER_NEEDS if row["role"] == "scheduler" else COLUMNS
        for name in needed:
            theirs, ours = row.get(name), mine.get(name)
            where = f"The {row['role']} on {row['host']}" + (f" ({row['address']})" if row["address"] else "")
            if theirs is None:
                raise PetmodelError(f"{where} has no {name} installed (this client has {ours}); install the "
                                    "packages of requirements.txt there.")
            if _cut(theirs, _MATCH[name]) != _cut(ours, _MATCH[name]):
                raise PetmodelError(f"{where} runs {name} {theirs} but this client runs {ours}; install the "
                                    "same version on both.")


def check_new_workers(client: Client, workers: list[str], *, timeout: float) -> None:
    """Compare workers that joined after connect (never compared) before a run uses them.

    Only for clients of a remote cluster (:func:`~petmodel.cluster.connect.connect` keeps the table it
    checked); the embedded cluster's workers run this very interpreter. Their rows join the table.
    """
    if not isinstance(client, PetmodelClient) or not client.petmodel_versions:
        return
    known = client.petmodel_versions
    seen = {row["address"] for row in known}
    new = [address for address in workers if address not in seen]
    if not new:
        return
    ship_by_value()
    rows = _worker_rows(client, new, timeout=timeout)
    check([known[0], *rows])
    client.petmodel_versions = [*known, *rows]
