"""Who a request comes from, and what it may do: the owner, an administrator, or a visitor.

The app is safe to start with no setup (Jupyter-style): a browser on the machine the server runs
on is the **owner** and gets the whole app without typing anything, because whoever can open a
loopback connection can already run code on that machine. Everyone else is a **visitor** (the
read-only pages) until they give ``$PETMODEL_ADMIN_PASSWORD`` (**admin**); with no password set
there is no way in for them at all.

A reverse proxy on the same host makes every visitor's connection come from loopback, so a
loopback request carrying any proxy header (:data:`PROXY_HEADERS`) counts as remote. A peer that
cannot be told (``None``, or text that is not an address) is remote too: the decision fails closed.

Pure and Streamlit-free: ``pages/_ui.py`` reads the request (``st.context``) and asks here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from enum import StrEnum

# Headers a forwarding proxy adds (any one of them, whatever its value, means "not the owner").
PROXY_HEADERS = frozenset({"x-forwarded-for", "forwarded", "x-real-ip", "x-forwarded-host", "x-forwarded-proto",
                           "x-client-ip", "true-client-ip", "cf-connecting-ip", "via"})
IPV6_CLIENT_PREFIX = 64  # one IPv6 client usually holds a whole /64: count its tries as one


class Role(StrEnum):
    """What a session may do: ``OWNER`` and ``ADMIN`` everything, ``VISITOR`` read and generate."""

    OWNER = "owner"
    ADMIN = "admin"
    VISITOR = "visitor"

    @property
    def controls(self) -> bool:
        """May start or stop work, change the cluster (start, scale, connect a scheduler, log in to a Dask
        Gateway and create or shut down its clusters), upload data or name a server file."""
        return self is not Role.VISITOR


def _address(peer: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``peer`` as an address (an IPv4-mapped IPv6 address as its IPv4 one); None if it is none."""
    if not peer:
        return None
    try:
        address = ipaddress.ip_address(peer.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def proxied(headers: Mapping[str, str] | Iterable[str]) -> bool:
    """True when the request passed a forwarding proxy (one of :data:`PROXY_HEADERS`, any case)."""
    return any(str(name).lower() in PROXY_HEADERS for name in headers)


def is_owner(peer: str | None, headers: Mapping[str, str] | Iterable[str]) -> bool:
    """True for a direct loopback connection (127.0.0.0/8, ::1) that no proxy forwarded."""
    address = _address(peer)
    return address is not None and address.is_loopback and not proxied(headers)


def request_role(peer: str | None, headers: Mapping[str, str] | Iterable[str], *, password_set: bool,
                 unlocked: bool) -> Role:
    """The role of a request from ``peer`` (its TCP peer address) with ``headers``.

    ``unlocked``: this session gave the admin password; it counts only while one is set, so a
    session unlocked before the password was removed does not stay an admin.
    """
    if is_owner(peer, headers):
        return Role.OWNER
    return Role.ADMIN if password_set and unlocked else Role.VISITOR


def client_key(peer: str | None) -> str:
    """The key wrong passwords are counted under: the address, an IPv6 address by its /64.

    A reload starts a new session but keeps the address, so counting by address (not session)
    stops a guesser from resetting the count, and one guesser never slows another client.
    """
    address = _address(peer)
    if address is None:
        return "unknown"
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/{IPV6_CLIENT_PREFIX}", strict=False))
    return str(address)
