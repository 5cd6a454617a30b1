"""Dask Gateway: a user's clusters on a gateway server: list them, create one, connect, scale, shut down.

Dask Gateway (the way Pangeo, Planetary Computer and Nebari serve Dask) hands out clusters on
demand to authenticated users; its schedulers and workers speak TLS with certificates it makes,
and clients reach them through its proxy (``gateway://`` addresses). The address and the
authentication come from dask-gateway's own configuration, the ``gateway`` section of Dask's
config (``DASK_GATEWAY__ADDRESS``, ``DASK_GATEWAY__AUTH__TYPE``, ``DASK_GATEWAY__AUTH__KWARGS__USERNAME``
and ``__PASSWORD``, a ``gateway.yaml``), so what users already set for their gateway works here; an
address, user name or password given here (``--gateway URL``, the Cluster page) wins.

A cluster from here is made ready to train like any other by
:func:`petmodel.cluster.connect.connect_cluster` (versions checked, this code shipped over TLS,
launches that grow it). Every call to the gateway is bounded, and every expected failure (a wrong
password, nothing listening, something else answering) is one sentence.
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from petmodel.compat import close_gateway_once, format_gateway_template, gateway_option_fields
from petmodel.errors import PetmodelError, UsageError, first_line

GATEWAY_TIMEOUT_S = 10.0  # one call to the gateway's API (list, options, scale, stop)
START_TIMEOUT_S = 180.0  # a new cluster's scheduler starting (a cloud gateway may first get a machine)
OPTION_KINDS = ("integer", "float", "bool", "select", "string")


def _import() -> Any:
    try:
        import dask_gateway
    except ImportError as err:  # pragma: no cover - requirements.txt installs it
        raise PetmodelError("Dask Gateway needs the dask-gateway package; pip install dask-gateway.") from err
    return dask_gateway


def configured_address() -> str | None:
    """The gateway address in Dask's config (``gateway.address``, e.g. ``$DASK_GATEWAY__ADDRESS``), or None."""
    import dask

    _import()  # loads dask-gateway's defaults into Dask's config
    value = format_gateway_template(dask.config.get("gateway.address", None))
    return str(value).strip() if value else None


def resolve_address(address: str | None) -> str:
    """``address`` (or the configured one) as ``http(s)://host[:port][/path]``; UsageError when neither is one."""
    text = (address or "").strip() or configured_address()
    if not text:
        raise UsageError("Give the Dask Gateway's address (--gateway URL, the Cluster page, or "
                         "$DASK_GATEWAY__ADDRESS), e.g. https://gateway.example.org.")
    parsed = urlparse(text)
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if parsed.scheme not in ("http", "https") or not parsed.hostname or port == -1:
        raise UsageError(f"{text!r} is not a Dask Gateway address; use http(s)://host[:port], e.g. "
                         "https://gateway.example.org.")
    return text.rstrip("/")


@dataclass(frozen=True)
class GatewayClusterInfo:
    """One of the user's clusters on the gateway, as the Cluster page lists it."""

    name: str
    status: str  # pending, running, stopping, stopped or failed
    started: str  # when it started, local time "YYYY-MM-DD HH:MM"
    dashboard: str | None


@dataclass(frozen=True)
class OptionField:
    """One cluster option the gateway offers (its ``cluster_options``), for a form."""

    name: str
    label: str
    kind: str  # one of OPTION_KINDS
    default: Any
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] = ()


class GatewayClient:
    """A logged-in handle on one gateway server; every call bounded by ``timeout``, failures in one sentence.

    Made by :func:`open_gateway` (which checks the address and the credentials at once). Close it
    with :meth:`close`; clusters it created or connected to have their own lifetimes.
    """

    def __init__(self, gateway: Any, address: str, user: str | None, timeout: float) -> None:
        self.gateway, self.address, self.user, self.timeout = gateway, address, user, timeout

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on a daemon thread, at most ``timeout`` s; gateway errors as sentences.

        A daemon thread, not a pool: a gateway that never answers must not keep the process from exiting.
        """
        limit = timeout or self.timeout
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as err:  # noqa: BLE001 - handed back to the caller's thread
                box["error"] = err

        thread = threading.Thread(target=run, name="petmodel-gateway-call", daemon=True)
        thread.start()
        thread.join(limit)
        if thread.is_alive():
            raise PetmodelError(f"The Dask Gateway at {self.address} did not answer within {limit:g} s while "
                                f"{what}; check the address and that the gateway is running.")
        if "error" in box:
            raise gateway_error(box["error"], self.address, what) from box["error"]
        return box.get("value")

    def clusters(self) -> list[GatewayClusterInfo]:
        """The user's pending and running clusters, newest first."""
        reports = self._call("listing your clusters", self.gateway.list_clusters)
        rows = [GatewayClusterInfo(name=r.name, status=r.status.name.lower(), started=_when(r.start_time),
                               dashboard=r.dashboard_link) for r in reports]
        return sorted(rows, key=lambda c: c.started, reverse=True)

    def options(self) -> list[OptionField]:
        """The cluster options this gateway offers (none for many gateways)."""
        options = self._call("reading its cluster options", self.gateway.cluster_options)
        # Each option's kind and bounds have no public accessor (see petmodel.compat); without them, the kinds
        # follow from the values, which the public mapping gives.
        fields = gateway_option_fields(options)
        if fields is not None:
            return [_field(kind, spec) for kind, spec in fields]
        return [OptionField(name=k, label=k, kind=_kind_of(v), default=v) for k, v in dict(options).items()]

    def create(self, options: Mapping[str, Any] | None = None, *, shutdown_on_close: bool = True,
               timeout: float = START_TIMEOUT_S) -> Any:
        """Start a new cluster (with these cluster options) and wait until its scheduler runs; the
        ``dask_gateway.GatewayCluster``. A cluster that does not start in time is stopped again."""
        chosen = None
        if options:
            chosen = self._call("reading its cluster options", self.gateway.cluster_options)
            for key, value in options.items():
                try:
                    chosen[key] = value
                except (KeyError, AttributeError, TypeError, ValueError) as err:
                    raise UsageError(f"The gateway's option {key} does not take {value!r} ({err}).") from None
        name = self._call("creating a cluster", self.gateway.submit, chosen)
        try:
            return self.attach(name, shutdown_on_close=shutdown_on_close, timeout=timeout)
        except BaseException:
            self.stop(name, quiet=True)
            raise

    def attach(self, name: str, *, shutdown_on_close: bool = False, timeout: float = START_TIMEOUT_S) -> Any:
        """The ``dask_gateway.GatewayCluster`` named ``name`` (waiting while it starts).

        It runs on an event loop of its own (``Gateway.connect`` would share this handle's), so it
        keeps working after this handle is closed.
        """
        if not isinstance(name, str) or not name.strip():
            raise UsageError("Pick one of your gateway clusters.")
        gw = _import()
        cluster = self._call(f"connecting to the cluster {name}", gw.GatewayCluster.from_name, name.strip(),
                             shutdown_on_close=shutdown_on_close, address=self.gateway.address,
                             proxy_address=self.gateway.proxy_address, auth=self.gateway.auth, timeout=timeout)
        close_gateway_once(cluster.gateway)
        return cluster

    def scale(self, name: str, n: int) -> None:
        """Ask the gateway for ``n`` workers in the cluster ``name``."""
        self._call(f"scaling the cluster {name}", self.gateway.scale_cluster, name, int(n))

    def stop(self, name: str, *, quiet: bool = False) -> None:
        """Shut the cluster ``name`` down (its workers and scheduler stop); ``quiet``: never raise."""
        try:
            self._call(f"shutting down the cluster {name}", self.gateway.stop_cluster, name)
        except PetmodelError:
            if not quiet:
                raise

    def close(self) -> None:
        """Close this handle (its HTTP session and event loop); never raises."""
        try:
            self._call("closing the connection", self.gateway.close, timeout=5.0)
        except Exception:  # noqa: BLE001 - teardown
            pass


def open_gateway(address: str | None = None, *, username: str | None = None, password: str | None = None,
                 timeout: float = GATEWAY_TIMEOUT_S) -> GatewayClient:
    """Log in to the gateway at ``address`` (default: Dask's config) and check it answers; a :class:`GatewayClient`.

    With a user name or a password, basic authentication with them (the other one from the config's
    ``gateway.auth.kwargs``); with neither, the config's ``gateway.auth`` (basic by default, or kerberos,
    jupyterhub, or a class). One sentence when the address is malformed, nothing answers, something
    other than a gateway answers, or the credentials are refused.
    """
    import dask

    gw_module = _import()
    url = resolve_address(address)
    auth: Any = None
    if username or password:
        kwargs = dask.config.get("gateway.auth.kwargs", None) or {}
        auth = gw_module.BasicAuth(username=username or kwargs.get("username") or None,
                                   password=password if password is not None else kwargs.get("password"))
    try:
        gateway = gw_module.Gateway(url, auth=auth)
    except Exception as err:  # noqa: BLE001 - a bad auth setting in the config, say
        raise PetmodelError(f"Could not set up the Dask Gateway client for {url} ({type(err).__name__}: {err}); "
                            "check the gateway section of your Dask config.") from err
    close_gateway_once(gateway)
    user = getattr(gateway.auth, "username", None)
    client = GatewayClient(gateway, url, user, timeout)
    try:
        client._call("logging in", gateway.list_clusters)
    except BaseException:
        client.close()
        raise
    return client


def gateway_error(err: BaseException, address: str, what: str) -> PetmodelError:
    """One sentence for what went wrong talking to the gateway at ``address`` while ``what``."""
    import aiohttp

    gw = _import()
    if isinstance(err, PetmodelError):
        return err
    if isinstance(err, aiohttp.ClientResponseError):
        if err.status in (401, 403):
            return PetmodelError(f"The Dask Gateway at {address} refused the user name or password (HTTP "
                                 f"{err.status}); check them (or $DASK_GATEWAY__AUTH__KWARGS__PASSWORD).")
        if err.status == 404:
            return PetmodelError(f"Something at {address} answered, but not as a Dask Gateway (HTTP 404); check the "
                                 "address.")
        return PetmodelError(f"The Dask Gateway at {address} answered HTTP {err.status} while {what}; try again "
                             "or ask its administrator.")
    if isinstance(err, (aiohttp.ClientConnectionError, OSError)):
        return PetmodelError(f"Could not reach a Dask Gateway at {address}; check the address and that the "
                             "gateway is running.")
    if isinstance(err, (aiohttp.ContentTypeError, aiohttp.ClientPayloadError, json.JSONDecodeError)):
        return PetmodelError(f"Something at {address} answered, but not as a Dask Gateway; check the address.")
    if isinstance(err, gw.GatewayClusterError):
        return PetmodelError(f"The Dask Gateway at {address} could not do it while {what}: {_first_line(err)}.")
    if isinstance(err, gw.GatewayServerError):
        return PetmodelError(f"The Dask Gateway at {address} failed while {what} (its error: {_first_line(err)}); "
                             "ask its administrator.")
    if isinstance(err, ValueError):  # the server's 404/422: no such cluster, a bad option
        return PetmodelError(f"The Dask Gateway at {address} refused while {what}: {_first_line(err)}.")
    return PetmodelError(f"Talking to the Dask Gateway at {address} failed while {what} ({type(err).__name__}: "
                         f"{_first_line(err)}).")


def _first_line(err: BaseException) -> str:
    return first_line(err).rstrip(".")  # our sentence adds its own full stop


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if isinstance(value, _dt.datetime) else ""


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return "integer" if isinstance(value, int) else "float" if isinstance(value, float) else "string"


def _field(kind: str, spec: Any) -> OptionField:
    """A dask-gateway options field of ``kind`` (see :func:`petmodel.compat.gateway_option_fields`) as an
    :class:`OptionField`."""
    return OptionField(name=spec.field, label=getattr(spec, "label", spec.field) or spec.field,
                       kind=kind if kind in OPTION_KINDS else "string", default=spec.get(),
                       minimum=getattr(spec, "min", None), maximum=getattr(spec, "max", None),
                       choices=tuple(getattr(spec, "options", ()) or ()))
