"""Connect to a running Dask scheduler, or a cluster object, and make it ready to train; disconnect or shut down.

Every expected failure (bad address, unreachable scheduler, something else on the port) is a
:class:`~petmodel.errors.PetmodelError` with one sentence for the user. A client returned by
:func:`connect` does not own the cluster: :func:`shutdown` disconnects and leaves it running.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from distributed import Client

from petmodel.cluster.client import PetmodelClient
from petmodel.cluster.local import register_torch_threads
from petmodel.cluster.workers import _positive_timeout
from petmodel.compat import client_running
from petmodel.config import ScalingConfig
from petmodel.errors import PetmodelError, UsageError

log = logging.getLogger(__name__)

_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
_ADDRESS = re.compile(
    r"^(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$"
)
_EXPECTED_FORM = "tcp://host:port, host:port, or the path of a scheduler JSON file"



def _normalise_address(text: str) -> str | None:
    """``scheme://host:port`` for a valid address, else ``None``."""
    match = _ADDRESS.match(text)
    if not match:
        return None
    scheme = (match["scheme"] or "tcp").lower()
    port = int(match["port"])
    if scheme not in _SCHEMES or not 1 <= port <= 65535:
        return None
    return f"{scheme}://{match['host']}:{port}"


def _looks_like_path(text: str) -> bool:
    return "://" not in text and (
        text.lower().endswith(".json") or "/" in text or os.sep in text or os.path.isfile(text)
    )


def _address_from_scheduler_file(path: Path) -> str:
    """The scheduler address recorded in a ``--scheduler-file`` JSON file."""
    if not path.is_file():
        raise PetmodelError(
            f"No scheduler file at {path}; check the path, or pass the scheduler's "
            "address as tcp://host:port."
        )
    try:
        address = json.loads(path.read_text(encoding="utf-8"))["address"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PetmodelError(
            f"{path} is not a Dask scheduler file (no readable \"address\" in its JSON); "
            "point to the file the scheduler wrote with --scheduler-file."
        ) from err
    normalised = _normalise_address(str(address))
    if normalised is None:
        raise PetmodelError(
            f"The scheduler file {path} holds an address in an unexpected form "
            f"({address!r}); expected tcp://host:port."
        )
    return normalised


def connect(address: str | os.PathLike[str], *, timeout: float = 10.0, security: Any = None,
            ship: bool = True) -> Client:
    """Connect to a running Dask scheduler and make it ready to train, each step within ``timeout``.

    ``address`` is ``tcp://host:port``, ``tls://host:port``, ``host:port``, or the path of the
    JSON file the scheduler wrote with ``--scheduler-file``; ``security``: a Dask ``Security``
    for ``tls://`` (see :mod:`petmodel.cluster.security`). Then: versions are compared on every
    process (:mod:`petmodel.cluster.versions`), this client's ``petmodel`` is shipped
    (:mod:`petmodel.cluster.shipping`, skipped with ``ship=False``), and workers get their torch
    tuning. A frozen worker makes the connect fail naming it rather than hang. The client does
    not own the cluster: :func:`shutdown` disconnects and leaves it running.
    """
    timeout = _positive_timeout(timeout)
    text = os.fspath(address).strip() if isinstance(address, (str, os.PathLike)) else ""
    if isinstance(address, os.PathLike) or _looks_like_path(text):
        target = _address_from_scheduler_file(Path(text).expanduser())
    else:
        normalised = _normalise_address(text)
        if normalised is None:
            raise UsageError(
                f"{str(address)!r} is not a Dask scheduler address; use {_EXPECTED_FORM}."
            )
        target = normalised
    if target.startswith("tls://") and security is None:
        raise PetmodelError(f"{target} needs TLS: give a CA file, certificate and key (--tls-ca-file, "
                            "--tls-cert, --tls-key or PETMODEL_TLS_* variables).")
    client = _open_client(target, timeout, security)
    try:
        _prepare_remote(client, timeout, ship)
    except BaseException:
        shutdown(client)
        raise
    return client


def _open_client(target: str, timeout: float, security: Any) -> PetmodelClient:
    """A client of the scheduler at ``target``; each way it can fail as one sentence."""
    try:
        return PetmodelClient(target, timeout=timeout, start_limit=timeout, own_loop=True, security=security)
    except ImportError as err:  # the scheduler refused us, e.g. over package versions
        raise PetmodelError(
            f"The Dask scheduler at {target} refused this client ({err}); install the same "
            "dask and distributed versions here as on the cluster."
        ) from err
    except OSError as err:  # refused, timed out, or unreachable (TimeoutError included)
        raise PetmodelError(
            f"Could not reach a Dask scheduler at {target} within {timeout:g} s; check the "
            "address and that the scheduler is running."
        ) from err
    except Exception as err:  # something answered but spoke another protocol
        raise PetmodelError(
            f"Something at {target} answered, but not as a Dask scheduler; check the "
            "address and port."
        ) from err


def connect_cluster(cluster: Any, *, timeout: float = 10.0, ship: bool = True, own: bool = False,
                    scaling: ScalingConfig | None = None, floor: int | None = None) -> PetmodelClient:
    """A client of a cluster *object*, made ready to train as :func:`connect` makes a scheduler's.

    ``cluster``: a ``distributed.deploy.Cluster`` (``LocalCluster``, dask-jobqueue's ``SLURMCluster``,
    dask-kubernetes' ``KubeCluster``, Coiled's) or a Dask Gateway ``GatewayCluster``: anything with a
    ``scheduler_address`` (and its ``security``, the gateway's TLS certificates). Versions are compared,
    this ``petmodel`` is shipped, and when the cluster can ``scale(n)``, launches on the client ask it
    for the workers they need, up to ``scaling.max_workers`` (:mod:`petmodel.cluster.scaling`; ``floor``:
    the size workers are given back down to, default its size now). ``own``: closing the client
    closes the cluster too (a gateway cluster created with ``shutdown_on_close`` then shuts down).
    """
    from petmodel.cluster import scaling as scaling_module

    timeout = _positive_timeout(timeout)
    address = getattr(cluster, "scheduler_address", None)
    if not isinstance(address, str) or not address:
        raise UsageError(f"{type(cluster).__name__} has no scheduler address; hand over a started Dask cluster "
                         "object (or give its scheduler's address).")
    client = _open_client(address, timeout, getattr(cluster, "security", None))
    if own:
        client.own(cluster)
    try:
        _prepare_remote(client, timeout, ship)
        link = getattr(cluster, "dashboard_link", None)
        client.petmodel_dashboard = link if isinstance(link, str) and link else None
        if scaling_module.can_scale(cluster):
            scaling_module.attach(client, scaling_module.ClusterScaler(client, cluster, scaling, floor=floor))
    except BaseException:
        if own:
            client.own(None)  # a failed start does not take the user's cluster down with it
        shutdown(client)
        raise
    return client


def _prepare_remote(client: PetmodelClient, timeout: float, ship: bool) -> None:
    """Versions, code, torch tuning; the findings stay on the client for the Cluster page."""
    from petmodel.cluster import shipping, versions
    from petmodel.cluster.workers import worker_addresses

    workers = worker_addresses(client, timeout=timeout)
    rows = versions.collect(client, workers, timeout=timeout)
    versions.check(rows)
    client.petmodel_versions = rows
    if ship:
        client.petmodel_code_hash = shipping.ship(client, workers, timeout=timeout)
    register_torch_threads(client, timeout, shipped=ship)


def shutdown(client: Client | None) -> None:
    """Close ``client`` and, if it owns one, its cluster; never raises.

    Meant for ``finally`` blocks and app teardown, where a second error would only hide
    the first. Safe to call twice.
    """
    if client is None:
        return
    from petmodel.cluster.scaling import detach

    detach(client)  # its scaler stops giving workers back before the cluster goes
    try:
        client.close()  # a client from start_local_cluster also closes its cluster here
    except Exception:
        log.warning("Closing the Dask client failed", exc_info=True)


def dashboard_link(client: Client) -> str | None:
    """URL of the cluster's dashboard, or ``None`` when it has none or the client is closed.

    A closed client still remembers its cluster's last link, which no longer leads anywhere.
    """
    if not client_running(client):
        return None
    given = getattr(client, "petmodel_dashboard", None)  # a cluster manager's link (a gateway proxies it)
    if isinstance(given, str) and given:
        return given
    try:
        return client.dashboard_link or None
    except Exception:  # no dashboard service, or a client that is closing
        return None
